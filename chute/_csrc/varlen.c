/* Variable-length columns in Arrow's layout: binary/string/list rows, map rows, and JSON batches.
 *
 * The validated spans and map plans built here are also what take_objects and take_dicts
 * read their Python objects from. */
#include "native.h"

/* ------------------------------------------------------------------ validation */

int ch_binary_spans(PyObject *module, const Batch *b, const Held *h, int64_t item_size, Span *spans)
{
    for (Py_ssize_t j = 0; j < b->ntouched; j++) {
        Py_ssize_t k = b->order[j];
        int64_t entries = ch_held_view(h, k, 0)->len / 8;
        if (entries < b->rows[k] + 1) {
            ch_raise_corrupt(module, b->shard[k], -1, "value offsets hold %lld entries, need %lld for %lld rows",
                             (long long)entries, (long long)(b->rows[k] + 1), (long long)b->rows[k]);
            return -1;
        }
    }
    for (Py_ssize_t i = 0; i < b->n; i++) {
        Py_ssize_t k = b->slot[i];
        int64_t r = b->row[i];
        const char *offsets = ch_held_view(h, k, 0)->buf;
        const Py_buffer *data = ch_held_view(h, k, 1);
        int64_t start = ch_ld64(offsets + 8 * r), stop = ch_ld64(offsets + 8 * (r + 1));
        if (start < 0 || stop < start) {
            ch_raise_corrupt(module, b->shard[k], r, "value offsets %lld, %lld are negative or decreasing",
                             (long long)start, (long long)stop);
            return -1;
        }
        if (stop > data->len / item_size) {
            ch_raise_corrupt(module, b->shard[k], r,
                             "value offset %lld is beyond the data buffer (%zd bytes, items of %lld bytes)",
                             (long long)stop, data->len, (long long)item_size);
            return -1;
        }
        spans[i].p = (const char *)data->buf + start * item_size;
        spans[i].len = (stop - start) * item_size;
    }
    return 0;
}

void ch_map_plan_free(MapPlan *plan)
{
    PyMem_Free(plan->first);
    PyMem_Free(plan->keys);
    PyMem_Free(plan->values);
    memset(plan, 0, sizeof(*plan));
}

/* Checks that the next `count` variable-length items starting at entry `e` are in bounds,
 * and records their spans. Reads each offset once. */
static int entry_spans(PyObject *module, const Batch *b, Py_ssize_t k, int64_t r, const Py_buffer *offsets,
                       const Py_buffer *data, int64_t e, int64_t count, Span *out, const char *what)
{
    const char *o = offsets->buf;
    int64_t start = ch_ld64(o + 8 * e);
    for (int64_t j = 0; j < count; j++) {
        int64_t stop = ch_ld64(o + 8 * (e + j + 1));
        if (start < 0 || stop < start || stop > data->len) {
            ch_raise_corrupt(module, b->shard[k], r,
                             "%s offsets %lld, %lld of entry %lld are negative, decreasing or beyond the %s data (%zd bytes)",
                             what, (long long)start, (long long)stop, (long long)(e + j), what, data->len);
            return -1;
        }
        out[j].p = (const char *)data->buf + start;
        out[j].len = stop - start;
        start = stop;
    }
    return 0;
}

int ch_map_plan(PyObject *module, const Batch *b, const Held *h, int variable, int64_t value_size, MapPlan *plan)
{
    memset(plan, 0, sizeof(*plan));
    Py_ssize_t n = b->n;
    for (Py_ssize_t j = 0; j < b->ntouched; j++) {
        Py_ssize_t k = b->order[j];
        if ((ch_held_view(h, k, 3)->obj != NULL) != variable) {
            PyErr_Format(PyExc_ValueError, "shard %d: value_offsets must be %s for %s values", (int)b->shard[k],
                         variable ? "a buffer" : "None", variable ? "variable-length" : "fixed-size");
            return -1;
        }
        int64_t entries = ch_held_view(h, k, 0)->len / 4;
        if (entries < b->rows[k] + 1) {
            ch_raise_corrupt(module, b->shard[k], -1, "entry offsets hold %lld entries, need %lld for %lld rows",
                             (long long)entries, (long long)(b->rows[k] + 1), (long long)b->rows[k]);
            return -1;
        }
    }

    /* Rows: their entry ranges, read once. */
    int64_t *start = PyMem_Malloc((size_t)(n > 0 ? n : 1) * sizeof(int64_t));
    plan->first = PyMem_Malloc((size_t)(n + 1) * sizeof(int64_t));
    if (start == NULL || plan->first == NULL) {
        PyMem_Free(start);
        PyErr_NoMemory();
        return -1;
    }
    plan->first[0] = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_ssize_t k = b->slot[i];
        int64_t r = b->row[i];
        const char *eo = ch_held_view(h, k, 0)->buf;
        int64_t e0 = ch_ld32(eo + 4 * r), e1 = ch_ld32(eo + 4 * (r + 1));
        int64_t keys = ch_held_view(h, k, 1)->len / 8 - 1;
        int64_t values = variable ? ch_held_view(h, k, 3)->len / 8 - 1 : ch_held_view(h, k, 4)->len / value_size;
        if (e0 < 0 || e1 < e0 || e1 > keys || e1 > values) {
            ch_raise_corrupt(module, b->shard[k], r,
                             "entry offsets %lld, %lld are negative, decreasing or beyond the %lld keys and %lld values",
                             (long long)e0, (long long)e1, (long long)(keys > 0 ? keys : 0),
                             (long long)(values > 0 ? values : 0));
            PyMem_Free(start);
            return -1;
        }
        start[i] = e0;
        plan->first[i + 1] = plan->first[i] + (e1 - e0);
        if (plan->first[i + 1] > INT32_MAX) {
            PyErr_Format(PyExc_ValueError, "the batch holds more than 2**31 - 1 map entries (Arrow's int32 map offsets)");
            PyMem_Free(start);
            return -1;
        }
    }
    plan->nentries = (Py_ssize_t)plan->first[n];

    /* Entries: their key and value bytes, read once. */
    Py_ssize_t m = plan->nentries > 0 ? plan->nentries : 1;
    plan->keys = PyMem_Malloc((size_t)m * sizeof(Span));
    plan->values = PyMem_Malloc((size_t)m * sizeof(Span));
    if (plan->keys == NULL || plan->values == NULL) {
        PyMem_Free(start);
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_ssize_t k = b->slot[i];
        int64_t r = b->row[i], f = plan->first[i], count = plan->first[i + 1] - f;
        if (entry_spans(module, b, k, r, ch_held_view(h, k, 1), ch_held_view(h, k, 2), start[i], count, plan->keys + f,
                        "key") < 0)
            goto fail;
        if (variable) {
            if (entry_spans(module, b, k, r, ch_held_view(h, k, 3), ch_held_view(h, k, 4), start[i], count,
                            plan->values + f, "value") < 0)
                goto fail;
        } else {
            const char *data = ch_held_view(h, k, 4)->buf;
            for (int64_t j = 0; j < count; j++) {
                plan->values[f + j].p = data + (start[i] + j) * value_size;
                plan->values[f + j].len = value_size;
            }
        }
    }
    PyMem_Free(start);
    return 0;
fail:
    PyMem_Free(start);
    return -1;
}

/* ------------------------------------------------------------------ copies */

/* The bytes of `count` spans together, or -1 with MemoryError when the sum overflows: each span is
 * within its shard's buffer, but a batch may name the same huge row many times. */
static int64_t spans_total(const Span *spans, Py_ssize_t count)
{
    int64_t total = 0;
    for (Py_ssize_t i = 0; i < count; i++) {
        if (CH_UNLIKELY(ch_add_overflow(total, spans[i].len, &total))) {
            PyErr_SetString(PyExc_MemoryError, "the batch's values together exceed 2**63 bytes");
            return -1;
        }
    }
    return total;
}

/* The values of consecutive entries of one row lie back to back in their shard. */
static char *copy_block(char *dst, const Span *spans, int64_t count)
{
    if (count == 0)
        return dst;
    const char *start = spans[0].p;
    size_t len = (size_t)(spans[count - 1].p + spans[count - 1].len - start);
    memcpy(dst, start, len);
    return dst + len;
}

/* Writes the offsets (counted in units of `unit` bytes) of `count` spans, from 0. */
static void write_offsets(char *dst, const Span *spans, Py_ssize_t count, int64_t unit)
{
    int64_t acc = 0;
    memcpy(dst, &acc, 8);
    for (Py_ssize_t i = 0; i < count; i++) {
        acc += spans[i].len / unit;
        memcpy(dst + 8 * (i + 1), &acc, 8);
    }
}

static PyThreadState *release_if_big(int64_t bytes)
{
    return bytes >= CH_RELEASE_GIL_BYTES ? PyEval_SaveThread() : NULL;
}

static void restore(PyThreadState *released)
{
    if (released != NULL)
        PyEval_RestoreThread(released);
}

/* Opens the batch, checks the sources list and takes the sources of every touched shard. */
static int open_sources(PyObject *module, Batch *b, Held *h, PyObject *indices, PyObject *offsets, PyObject *sources,
                        int nbuf, unsigned optional)
{
    memset(h, 0, sizeof(*h));
    if (ch_batch_open(b, indices, offsets) < 0)
        return -1;
    if (ch_check_sources(sources, b->nshards, "sources") < 0)
        return -1;
    if (ch_batch_resolve(b) < 0)
        return -1;
    if (ch_held_init(h, b->nslots, nbuf, optional) < 0)
        return -1;
    for (Py_ssize_t j = 0; j < b->ntouched; j++) {
        Py_ssize_t k = b->order[j];
        if (ch_held_take(module, h, b, k, sources, "sources") < 0)
            return -1;
    }
    return 0;
}

int ch_open_binary(PyObject *module, Batch *b, Held *h, PyObject *indices, PyObject *offsets, PyObject *sources,
                   int64_t item_size, Span **spans)
{
    *spans = NULL;
    if (open_sources(module, b, h, indices, offsets, sources, 2, 0) < 0)
        return -1;
    *spans = PyMem_Malloc((size_t)(b->n > 0 ? b->n : 1) * sizeof(Span));
    if (*spans == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    return ch_binary_spans(module, b, h, item_size, *spans);
}

int ch_open_map(PyObject *module, Batch *b, Held *h, PyObject *indices, PyObject *offsets, PyObject *sources,
                int variable, int64_t value_size, MapPlan *plan, int *variable_out)
{
    memset(plan, 0, sizeof(*plan));
    if (open_sources(module, b, h, indices, offsets, sources, 5, 1u << 3) < 0)
        return -1;
    if (variable < 0) {
        variable = 0;
        if (b->ntouched > 0)
            variable = ch_held_view(h, b->order[0], 3)->obj != NULL;
        else {
            for (Py_ssize_t s = 0; s < PySequence_Fast_GET_SIZE(sources); s++) {
                PyObject *item = ch_item_ref(sources, s, "sources");
                if (item == NULL)
                    return -1;
                int found = PyTuple_Check(item) && PyTuple_GET_SIZE(item) == 5;
                if (found)
                    variable = PyTuple_GET_ITEM(item, 3) != Py_None;
                Py_DECREF(item);
                if (found)
                    break;
            }
        }
    }
    *variable_out = variable;
    return ch_map_plan(module, b, h, variable, value_size, plan);
}

PyObject *ch_gather_binary(PyObject *module, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    static const char *const names[] = {"indices", "offsets", "sources", "item_size", NULL};
    PyObject *a[4];
    if (ch_parse_args("gather_binary", args, nargs, kwnames, names, 3, a) < 0)
        return NULL;
    int64_t item_size = 1;
    if (a[3] != NULL && ch_int_arg(a[3], 1, INT32_MAX, "item_size", &item_size) < 0)
        return NULL;
    Batch b;
    Held h;
    Span *spans = NULL;
    PyObject *new_offsets = NULL, *new_data = NULL, *result = NULL;
    if (ch_open_binary(module, &b, &h, a[0], a[1], a[2], item_size, &spans) < 0)
        goto done;
    int64_t total = spans_total(spans, b.n);
    if (total < 0)
        goto done;
    new_offsets = PyBytes_FromStringAndSize(NULL, (b.n + 1) * 8);
    new_data = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)total);
    if (new_offsets == NULL || new_data == NULL)
        goto done;
    PyThreadState *released = release_if_big(total);
    write_offsets(PyBytes_AS_STRING(new_offsets), spans, b.n, item_size);
    char *dst = PyBytes_AS_STRING(new_data);
    for (Py_ssize_t i = 0; i < b.n; i++) {
        memcpy(dst, spans[i].p, (size_t)spans[i].len);
        dst += spans[i].len;
    }
    restore(released);
    result = PyTuple_Pack(2, new_offsets, new_data);
done:
    Py_XDECREF(new_offsets);
    Py_XDECREF(new_data);
    PyMem_Free(spans);
    ch_held_close(&h);
    ch_batch_close(&b);
    return result;
}

/* Map keys are large_string: refuse a key that is not UTF-8, naming its shard and row. */
static int check_keys(PyObject *module, const Batch *b, const MapPlan *plan)
{
    for (Py_ssize_t i = 0; i < b->n; i++) {
        int64_t f = plan->first[i], count = plan->first[i + 1] - f;
        if (count == 0)
            continue;
        const Span *keys = plan->keys + f;
        const char *end = keys[count - 1].p + keys[count - 1].len;
        if (ch_is_ascii(keys[0].p, end - keys[0].p))
            continue;
        for (int64_t j = 0; j < count; j++) {
            if (!ch_utf8_valid(keys[j].p, keys[j].len)) {
                ch_raise_corrupt(module, b->shard[b->slot[i]], b->row[i], "the key of map entry %lld is not valid UTF-8",
                                 (long long)j);
                return -1;
            }
        }
    }
    return 0;
}

PyObject *ch_gather_map(PyObject *module, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    static const char *const names[] = {"indices", "offsets", "sources", "value_size", NULL};
    PyObject *a[4];
    if (ch_parse_args("gather_map", args, nargs, kwnames, names, 3, a) < 0)
        return NULL;
    int64_t value_size = 8;
    if (a[3] != NULL && ch_int_arg(a[3], 1, INT32_MAX, "value_size", &value_size) < 0)
        return NULL;
    Batch b;
    Held h;
    MapPlan plan;
    int variable;
    PyObject *out[5] = {NULL, NULL, NULL, NULL, NULL};
    PyObject *result = NULL;
    if (ch_open_map(module, &b, &h, a[0], a[1], a[2], -1, value_size, &plan, &variable) < 0)
        goto done;
    if (check_keys(module, &b, &plan) < 0)
        goto done;
    Py_ssize_t n = b.n, m = plan.nentries;
    int64_t key_bytes = spans_total(plan.keys, m), value_bytes = key_bytes < 0 ? -1 : spans_total(plan.values, m);
    if (key_bytes < 0 || value_bytes < 0)
        goto done;
    out[0] = PyBytes_FromStringAndSize(NULL, (n + 1) * 4);
    out[1] = PyBytes_FromStringAndSize(NULL, (m + 1) * 8);
    out[2] = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)key_bytes);
    out[3] = PyBytes_FromStringAndSize(NULL, variable ? (m + 1) * 8 : 0);
    out[4] = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)value_bytes);
    for (int j = 0; j < 5; j++) {
        if (out[j] == NULL)
            goto done;
    }
    PyThreadState *released = release_if_big(key_bytes + value_bytes);
    char *entry_offsets = PyBytes_AS_STRING(out[0]);
    for (Py_ssize_t i = 0; i <= n; i++) {
        int32_t v = (int32_t)plan.first[i];
        memcpy(entry_offsets + 4 * i, &v, 4);
    }
    write_offsets(PyBytes_AS_STRING(out[1]), plan.keys, m, 1);
    if (variable)
        write_offsets(PyBytes_AS_STRING(out[3]), plan.values, m, 1);
    char *keys = PyBytes_AS_STRING(out[2]), *values = PyBytes_AS_STRING(out[4]);
    for (Py_ssize_t i = 0; i < n; i++) {
        int64_t f = plan.first[i], count = plan.first[i + 1] - f;
        keys = copy_block(keys, plan.keys + f, count);
        values = copy_block(values, plan.values + f, count);
    }
    restore(released);
    result = PyTuple_Pack(5, out[0], out[1], out[2], out[3], out[4]);
done:
    for (int j = 0; j < 5; j++)
        Py_XDECREF(out[j]);
    ch_map_plan_free(&plan);
    ch_held_close(&h);
    ch_batch_close(&b);
    return result;
}

PyObject *ch_join_json(PyObject *module, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    (void)module;
    static const char *const names[] = {"offsets", "data", NULL};
    PyObject *a[2];
    if (ch_parse_args("join_json", args, nargs, kwnames, names, 2, a) < 0)
        return NULL;
    Py_buffer offsets_view = {0}, data_view = {0};
    int64_t *offsets = NULL;
    PyObject *result = NULL;
    Py_ssize_t count;
    if (ch_int_buffer(a[0], &offsets_view, 8, 0, 1, "offsets", &count) < 0)
        goto done;
    if (ch_byte_buffer(a[1], &data_view, 0, "data") < 0)
        goto done;
    if (count < 1) {
        PyErr_SetString(PyExc_ValueError, "offsets must hold n + 1 entries for n rows, got none");
        goto done;
    }
    offsets = PyMem_Malloc((size_t)count * sizeof(int64_t));
    if (offsets == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < count; i++) {
        offsets[i] = ch_ld64((const char *)offsets_view.buf + 8 * i);
        if ((i == 0 && offsets[0] < 0) || (i > 0 && offsets[i] < offsets[i - 1]) || offsets[i] > data_view.len) {
            PyErr_Format(PyExc_ValueError,
                         "offsets[%zd] = %lld is negative, decreasing or beyond the data (%zd bytes)", i,
                         (long long)offsets[i], data_view.len);
            goto done;
        }
    }
    Py_ssize_t rows = count - 1;
    int64_t size = 2 + (offsets[rows] - offsets[0]) + (rows > 0 ? rows - 1 : 0);
    result = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)size);
    if (result == NULL)
        goto done;
    PyThreadState *released = release_if_big(size);
    char *dst = PyBytes_AS_STRING(result);
    const char *data = data_view.buf;
    *dst++ = '[';
    for (Py_ssize_t i = 0; i < rows; i++) {
        if (i > 0)
            *dst++ = ',';
        memcpy(dst, data + offsets[i], (size_t)(offsets[i + 1] - offsets[i]));
        dst += offsets[i + 1] - offsets[i];
    }
    *dst = ']';
    restore(released);
done:
    PyMem_Free(offsets);
    ch_release(&offsets_view);
    ch_release(&data_view);
    return result;
}
