/* gather: fixed-size rows of any number of columns, from many shards, into output buffers. */
#include "native.h"

typedef struct {
    PyObject *sources; /* a reference to the list */
    Py_buffer out;
    int64_t row_bytes;
    Held held;
    const char **base; /* per slot: the shard's first row */
} Column;

/* Row i of dst = row row[i] of the shard in slot[i]; rows of exactly `size` bytes. */
#define COPY_LOOP(size)                                                                    \
    for (Py_ssize_t i = 0; i < n; i++)                                                     \
        memcpy(dst + (size) * i, base[slot[i]] + (size) * row[i], (size));

/* Prefetches into every cache level while row i is copied: the first and last bytes of row i + 8, and
 * every other line of row i + 2 when rows are at most a page. A mapped shard sits in the page cache, much
 * of it in 4 KiB pages, where a random row costs a TLB miss and a page walk: a software prefetch starts
 * both early (x86 walks the page tables for one), and the lines of a row nearly due arrive before memcpy
 * asks for them. Rows of 1-16 bytes (the loops above) gain nothing; rows over a page stream well. */
#define CH_PREFETCH_FAR 8
#define CH_PREFETCH_NEAR 2
#define CH_PREFETCH_LINE 64

void ch_copy_rows(char *dst, const char *const *base, const int32_t *slot, const int64_t *row, Py_ssize_t n,
                  int64_t rb)
{
    switch (rb) {
    case 1: COPY_LOOP(1); return;
    case 2: COPY_LOOP(2); return;
    case 4: COPY_LOOP(4); return;
    case 8: COPY_LOOP(8); return;
    case 16: COPY_LOOP(16); return;
    default: break;
    }
#if defined(__GNUC__) || defined(__clang__)
    int64_t lines = rb <= 4096 ? rb - CH_PREFETCH_LINE : 0; /* the middle lines of a row nearly due */
    for (Py_ssize_t i = 0; i < n; i++) {
        if (i + CH_PREFETCH_FAR < n) {
            const char *far = base[slot[i + CH_PREFETCH_FAR]] + rb * row[i + CH_PREFETCH_FAR];
            __builtin_prefetch(far, 0, 3);
            __builtin_prefetch(far + rb - 1, 0, 3);
        }
        if (i + CH_PREFETCH_NEAR < n) {
            const char *near = base[slot[i + CH_PREFETCH_NEAR]] + rb * row[i + CH_PREFETCH_NEAR];
            for (int64_t k = CH_PREFETCH_LINE; k < lines; k += CH_PREFETCH_LINE)
                __builtin_prefetch(near + k, 0, 3);
        }
        memcpy(dst + rb * i, base[slot[i]] + rb * row[i], (size_t)rb);
    }
#else
    COPY_LOOP(rb);
#endif
}

/* Prefixes the pending ValueError's message with the column it is about. */
static void prefix_error(Py_ssize_t column)
{
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    PyErr_Format(type, "columns[%zd]: %S", column, value);
    Py_XDECREF(type);
    Py_XDECREF(value);
    Py_XDECREF(tb);
}

static int parse_columns(PyObject *columns, const Batch *b, Column **out_cols, Py_ssize_t *out_ncols)
{
    /* A private tuple: its items stay while buffer exports run, whatever happens to the caller's list. */
    PyObject *seq = PySequence_Tuple(columns);
    if (seq == NULL) {
        PyErr_SetString(PyExc_ValueError, "columns must be a sequence of (sources, out, row_bytes) tuples");
        return -1;
    }
    Py_ssize_t ncols = PyTuple_GET_SIZE(seq);
    Column *cols = PyMem_Calloc((size_t)(ncols > 0 ? ncols : 1), sizeof(Column));
    if (cols == NULL) {
        Py_DECREF(seq);
        PyErr_NoMemory();
        return -1;
    }
    *out_cols = cols;
    *out_ncols = ncols;
    int status = -1;
    for (Py_ssize_t c = 0; c < ncols; c++) {
        PyObject *spec = PyTuple_GET_ITEM(seq, c);
        if (!PyTuple_Check(spec) || PyTuple_GET_SIZE(spec) != 3) {
            PyErr_Format(PyExc_ValueError, "columns[%zd] must be a (sources, out, row_bytes) tuple, got %.100s", c,
                         Py_TYPE(spec)->tp_name);
            goto done;
        }
        if (ch_int_arg(PyTuple_GET_ITEM(spec, 2), 1, INT64_MAX, "row_bytes", &cols[c].row_bytes) < 0 ||
            ch_check_sources(PyTuple_GET_ITEM(spec, 0), b->nshards, "sources") < 0 ||
            ch_byte_buffer(PyTuple_GET_ITEM(spec, 1), &cols[c].out, 1, "out") < 0) {
            prefix_error(c);
            goto done;
        }
        cols[c].sources = Py_NewRef(PyTuple_GET_ITEM(spec, 0));
        int64_t need;
        if (ch_mul_overflow((int64_t)b->n, cols[c].row_bytes, &need) || need != cols[c].out.len) {
            PyErr_Format(PyExc_ValueError, "columns[%zd]: out holds %zd bytes, needs %zd rows x %lld bytes", c,
                         cols[c].out.len, b->n, (long long)cols[c].row_bytes);
            goto done;
        }
    }
    status = 0;
done:
    Py_DECREF(seq);
    return status;
}

static void close_columns(Column *cols, Py_ssize_t ncols)
{
    if (cols == NULL)
        return;
    for (Py_ssize_t c = 0; c < ncols; c++) {
        ch_release(&cols[c].out);
        ch_held_close(&cols[c].held);
        Py_XDECREF(cols[c].sources);
        PyMem_Free((void *)cols[c].base);
    }
    PyMem_Free(cols);
}

/* Exports every touched shard of every column, lowest shard first, so that the first
 * None met is the lowest unmapped shard; checks each shard is long enough. */
static int take_sources(PyObject *module, const Batch *b, Column *cols, Py_ssize_t ncols)
{
    for (Py_ssize_t c = 0; c < ncols; c++) {
        if (ch_held_init(&cols[c].held, b->nslots, 1, 0) < 0)
            return -1;
        cols[c].base = PyMem_Calloc((size_t)(b->nslots > 0 ? b->nslots : 1), sizeof(char *));
        if (cols[c].base == NULL) {
            PyErr_NoMemory();
            return -1;
        }
    }
    for (Py_ssize_t j = 0; j < b->ntouched; j++) {
        Py_ssize_t k = b->order[j];
        for (Py_ssize_t c = 0; c < ncols; c++) {
            if (ch_held_take(module, &cols[c].held, b, k, cols[c].sources, "sources") < 0) {
                if (PyErr_ExceptionMatches(PyExc_ValueError))
                    prefix_error(c);
                return -1;
            }
        }
    }
    for (Py_ssize_t j = 0; j < b->ntouched; j++) {
        Py_ssize_t k = b->order[j];
        for (Py_ssize_t c = 0; c < ncols; c++) {
            Py_buffer *view = ch_held_view(&cols[c].held, k, 0);
            int64_t need;
            if (ch_mul_overflow(b->rows[k], cols[c].row_bytes, &need) || view->len < need) {
                ch_raise_corrupt(module, b->shard[k], -1,
                                 "column %zd holds %zd bytes, too few for %lld rows of %lld bytes", c, view->len,
                                 (long long)b->rows[k], (long long)cols[c].row_bytes);
                return -1;
            }
            cols[c].base[k] = view->buf;
        }
    }
    return 0;
}

PyObject *ch_gather(PyObject *module, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    static const char *const names[] = {"indices", "offsets", "columns", NULL};
    PyObject *a[3];
    if (ch_parse_args("gather", args, nargs, kwnames, names, 3, a) < 0)
        return NULL;
    Batch b;
    Column *cols = NULL;
    Py_ssize_t ncols = 0;
    PyObject *result = NULL;
    if (ch_batch_open(&b, a[0], a[1]) < 0)
        goto done;
    if (parse_columns(a[2], &b, &cols, &ncols) < 0)
        goto done;
    if (ch_batch_resolve(&b) < 0)
        goto done;
    if (take_sources(module, &b, cols, ncols) < 0)
        goto done;

    int64_t total = 0;
    for (Py_ssize_t c = 0; c < ncols; c++)
        total += cols[c].out.len;
    PyThreadState *released = total >= CH_RELEASE_GIL_BYTES ? PyEval_SaveThread() : NULL;
    for (Py_ssize_t c = 0; c < ncols; c++)
        ch_copy_rows(cols[c].out.buf, cols[c].base, b.slot, b.row, b.n, cols[c].row_bytes);
    if (released != NULL)
        PyEval_RestoreThread(released);
    result = Py_NewRef(Py_None);
done:
    close_columns(cols, ncols);
    ch_batch_close(&b);
    return result;
}
