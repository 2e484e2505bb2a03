/* Argument parsing, buffer exports, errors and the batch plan shared by every function. */
#include "native.h"

#include <stdarg.h>

/* ------------------------------------------------------------------ arguments */

int ch_parse_args(const char *fname, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames,
                  const char *const *names, Py_ssize_t nrequired, PyObject **out)
{
    Py_ssize_t total = 0;
    while (names[total] != NULL)
        total++;
    if (nargs > total) {
        PyErr_Format(PyExc_TypeError, "%s() takes at most %zd arguments (%zd given)", fname, total, nargs);
        return -1;
    }
    for (Py_ssize_t i = 0; i < total; i++)
        out[i] = i < nargs ? args[i] : NULL;
    Py_ssize_t nkw = kwnames == NULL ? 0 : PyTuple_GET_SIZE(kwnames);
    for (Py_ssize_t k = 0; k < nkw; k++) {
        const char *name = PyUnicode_AsUTF8(PyTuple_GET_ITEM(kwnames, k));
        if (name == NULL)
            return -1;
        Py_ssize_t j = 0;
        while (j < total && strcmp(names[j], name) != 0)
            j++;
        if (j == total) {
            PyErr_Format(PyExc_TypeError, "%s() got an unexpected keyword argument '%s'", fname, name);
            return -1;
        }
        if (out[j] != NULL) {
            PyErr_Format(PyExc_TypeError, "%s() got multiple values for argument '%s'", fname, name);
            return -1;
        }
        out[j] = args[nargs + k];
    }
    for (Py_ssize_t i = 0; i < nrequired; i++) {
        if (out[i] == NULL) {
            PyErr_Format(PyExc_TypeError, "%s() missing required argument '%s'", fname, names[i]);
            return -1;
        }
    }
    return 0;
}

int ch_int_arg(PyObject *obj, int64_t lo, int64_t hi, const char *what, int64_t *out)
{
    if (!PyLong_Check(obj) || PyBool_Check(obj)) {
        PyErr_Format(PyExc_ValueError, "%s must be an int, got %.100s", what, Py_TYPE(obj)->tp_name);
        return -1;
    }
    int overflow = 0;
    long long v = PyLong_AsLongLongAndOverflow(obj, &overflow);
    if (v == -1 && PyErr_Occurred())
        return -1;
    if (overflow != 0 || v < lo || v > hi) {
        PyErr_Format(PyExc_ValueError, "%s must be in [%lld, %lld], got %R", what, (long long)lo, (long long)hi, obj);
        return -1;
    }
    *out = (int64_t)v;
    return 0;
}

/* A struct-module format string naming one native item of the given kinds, e.g. "l", "<q". */
static int format_is(const char *fmt, const char *kinds)
{
    if (fmt == NULL)
        return strchr(kinds, 'B') != NULL;
    if (*fmt == '@' || *fmt == '=')
        fmt++;
#if PY_LITTLE_ENDIAN
    else if (*fmt == '<')
        fmt++;
#endif
    return fmt[0] != '\0' && fmt[1] == '\0' && strchr(kinds, fmt[0]) != NULL;
}

/* Exports obj's buffer; on failure a ValueError naming it as what[i][j] (negative
 * indices omitted): the label is only formatted when it is needed. */
static int export(PyObject *obj, Py_buffer *view, int flags, const char *what, Py_ssize_t i, Py_ssize_t j)
{
    if (PyObject_GetBuffer(obj, view, flags) == 0)
        return 0;
    view->obj = NULL;
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    char label[160];
    if (i < 0)
        PyOS_snprintf(label, sizeof(label), "%s", what);
    else if (j < 0)
        PyOS_snprintf(label, sizeof(label), "%s[%zd]", what, i);
    else
        PyOS_snprintf(label, sizeof(label), "%s[%zd][%zd]", what, i, j);
    PyErr_Format(PyExc_ValueError, "%s must be a C-contiguous%s buffer (bytes, numpy array, pyarrow Buffer), got %.100s: %S",
                 label, (flags & PyBUF_WRITABLE) ? " writable" : "", Py_TYPE(obj)->tp_name,
                 value != NULL ? value : Py_None);
    Py_XDECREF(type);
    Py_XDECREF(value);
    Py_XDECREF(tb);
    return -1;
}

int ch_byte_buffer(PyObject *obj, Py_buffer *view, int writable, const char *what)
{
    return export(obj, view, writable ? PyBUF_WRITABLE : PyBUF_SIMPLE, what, -1, -1);
}

int ch_int_buffer(PyObject *obj, Py_buffer *view, int itemsize, int writable, int exact,
                  const char *what, Py_ssize_t *count)
{
    int flags = PyBUF_FORMAT | PyBUF_C_CONTIGUOUS | (writable ? PyBUF_WRITABLE : 0);
    if (export(obj, view, flags, what, -1, -1) < 0)
        return -1;
    const char *kinds = itemsize == 8 ? (sizeof(long) == 8 ? "qln" : "qn") : (sizeof(int) == 4 ? "il" : "i");
    int as_bytes = view->itemsize == 1 && format_is(view->format, "Bbc");
    int as_ints = view->itemsize == itemsize && format_is(view->format, kinds);
    if (!as_bytes && !as_ints) {
        PyErr_Format(PyExc_ValueError, "%s must be an int%d buffer (or raw bytes), got format '%s' with %zd-byte items",
                     what, itemsize * 8, view->format != NULL ? view->format : "B", view->itemsize);
        ch_release(view);
        return -1;
    }
    if (exact && view->len % itemsize != 0) {
        PyErr_Format(PyExc_ValueError, "%s holds %zd bytes, not a whole number of int%d", what, view->len, itemsize * 8);
        ch_release(view);
        return -1;
    }
    *count = view->len / itemsize;
    return 0;
}

/* ------------------------------------------------------------------ errors */

static PyObject *raise_with(PyObject *cls, PyObject *message, Py_ssize_t shard, int64_t row, int with_row)
{
    if (message == NULL)
        return NULL;
    PyObject *exc = PyObject_CallOneArg(cls, message);
    Py_DECREF(message);
    if (exc == NULL)
        return NULL;
    PyObject *value = PyLong_FromSsize_t(shard);
    int failed = value == NULL || PyObject_SetAttrString(exc, "shard", value) < 0;
    Py_XDECREF(value);
    if (!failed && with_row) {
        value = PyLong_FromLongLong(row);
        failed = value == NULL || PyObject_SetAttrString(exc, "row", value) < 0;
        Py_XDECREF(value);
    }
    if (!failed)
        PyErr_SetObject(cls, exc);
    Py_DECREF(exc);
    return NULL;
}

PyObject *ch_raise_unmapped(PyObject *module, Py_ssize_t shard)
{
    PyObject *message = PyUnicode_FromFormat("shard %zd is not mapped: map it and call again", shard);
    return raise_with(ch_state(module)->unmapped, message, shard, -1, 0);
}

PyObject *ch_raise_corrupt(PyObject *module, Py_ssize_t shard, int64_t row, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    PyObject *detail = PyUnicode_FromFormatV(fmt, ap);
    va_end(ap);
    if (detail == NULL)
        return NULL;
    PyObject *message = row >= 0 ? PyUnicode_FromFormat("shard %zd, row %lld: %U", shard, (long long)row, detail)
                                 : PyUnicode_FromFormat("shard %zd: %U", shard, detail);
    Py_DECREF(detail);
    return raise_with(ch_state(module)->corrupt, message, shard, row, 1);
}

/* ------------------------------------------------------------------ the batch plan */

int ch_batch_open(Batch *b, PyObject *indices, PyObject *offsets)
{
    memset(b, 0, sizeof(*b));
    Py_ssize_t noffsets;
    if (ch_int_buffer(indices, &b->indices_view, 8, 0, 1, "indices", &b->n) < 0)
        return -1;
    if (ch_int_buffer(offsets, &b->offsets_view, 8, 0, 1, "offsets", &noffsets) < 0)
        return -1;
    if (noffsets < 1 || noffsets - 1 > INT32_MAX) {
        PyErr_Format(PyExc_ValueError, "offsets must hold S + 1 entries for S shards (S < 2**31), got %zd", noffsets);
        return -1;
    }
    b->nshards = noffsets - 1;
    b->offsets = PyMem_Malloc((size_t)noffsets * sizeof(int64_t));
    if (b->offsets == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    const char *p = b->offsets_view.buf;
    for (Py_ssize_t s = 0; s < noffsets; s++)
        b->offsets[s] = ch_ld64(p + 8 * s);
    if (b->offsets[0] != 0) {
        PyErr_Format(PyExc_ValueError, "offsets[0] must be 0, got %lld", (long long)b->offsets[0]);
        return -1;
    }
    int64_t decreasing = 0;
    for (Py_ssize_t s = 0; s < b->nshards; s++)
        decreasing |= b->offsets[s + 1] < b->offsets[s];
    if (decreasing) {
        for (Py_ssize_t s = 0; s < b->nshards; s++) {
            if (b->offsets[s + 1] < b->offsets[s]) {
                PyErr_Format(PyExc_ValueError, "offsets must be non-decreasing: offsets[%zd] = %lld > offsets[%zd] = %lld",
                             s, (long long)b->offsets[s], s + 1, (long long)b->offsets[s + 1]);
                return -1;
            }
        }
    }
    return 0;
}

/* The last shard s in [0, nshards) with offsets[s] <= x (offsets[0] = 0 <= x < offsets[nshards]).
 * Branch-free: the searches of consecutive indices overlap in the pipeline. */
static inline Py_ssize_t find_shard(const int64_t *offsets, Py_ssize_t nshards, int64_t x)
{
    const int64_t *base = offsets;
    Py_ssize_t len = nshards;
    while (len > 1) {
        Py_ssize_t half = len >> 1;
        base = base[half] <= x ? base + half : base;
        len -= half;
    }
    return base - offsets;
}

/* Up to this many shards, every shard has a slot (its own number): no slot bookkeeping
 * per index. Beyond, only the touched shards get one. */
#define SHARDS_AS_SLOTS 16

int ch_batch_resolve(Batch *b)
{
    Py_ssize_t n = b->n, nshards = b->nshards;
    int direct = nshards <= SHARDS_AS_SLOTS;
    Py_ssize_t nslots = direct ? nshards : (n < nshards ? n : nshards); /* at most */
    /* One block: row (n int64), rows (nslots int64), slot (n int32), shard (nslots int32),
     * order (nslots int32), mark (nshards int32). */
    size_t bytes = (size_t)(n + nslots) * 8 + (size_t)(n + 2 * nslots + nshards) * 4 + 8;
    char *block = PyMem_Malloc(bytes);
    if (block == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    b->row = (int64_t *)block;
    b->rows = b->row + n;
    b->slot = (int32_t *)(b->rows + nslots);
    b->shard = b->slot + n;
    b->order = b->shard + nslots;
    int32_t *mark = b->order + nslots; /* per shard: touched (direct), or its slot + 1 */
    memset(mark, 0, (size_t)nshards * 4);

    const int64_t *offsets = b->offsets;
    int64_t total = offsets[nshards];
    const char *ip = b->indices_view.buf;
    Py_ssize_t used = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        int64_t x = ch_ld64(ip + 8 * i);
        if (CH_UNLIKELY((uint64_t)x >= (uint64_t)total)) {
            PyErr_Format(PyExc_IndexError, "index %lld (position %zd of the batch) is out of range for %lld rows",
                         (long long)x, i, (long long)total);
            return -1;
        }
        Py_ssize_t s = find_shard(offsets, nshards, x);
        b->row[i] = x - offsets[s];
        if (direct) {
            b->slot[i] = (int32_t)s;
            mark[s] = 1;
        } else {
            if (mark[s] == 0) {
                b->shard[used] = (int32_t)s;
                mark[s] = (int32_t)++used;
            }
            b->slot[i] = mark[s] - 1;
        }
    }

    /* The touched slots by ascending shard: their sources are taken in that order. */
    Py_ssize_t touched = 0;
    if (direct) {
        for (Py_ssize_t s = 0; s < nshards; s++) {
            b->shard[s] = (int32_t)s;
            if (mark[s])
                b->order[touched++] = (int32_t)s;
        }
    } else if (used <= 32) { /* insertion sort: a batch usually touches a few shards */
        for (Py_ssize_t k = 0; k < used; k++) {
            Py_ssize_t j = k;
            while (j > 0 && b->shard[b->order[j - 1]] > b->shard[k]) {
                b->order[j] = b->order[j - 1];
                j--;
            }
            b->order[j] = (int32_t)k;
        }
        touched = used;
    } else {
        for (Py_ssize_t s = 0; s < nshards; s++) {
            if (mark[s] != 0)
                b->order[touched++] = mark[s] - 1;
        }
    }
    b->nslots = direct ? nshards : used;
    b->ntouched = touched;
    for (Py_ssize_t k = 0; k < b->nslots; k++)
        b->rows[k] = offsets[b->shard[k] + 1] - offsets[b->shard[k]];
    return 0;
}

void ch_batch_close(Batch *b)
{
    ch_release(&b->indices_view);
    ch_release(&b->offsets_view);
    PyMem_Free(b->offsets);
    PyMem_Free(b->row); /* the block of row, rows, slot, shard and order */
    memset(b, 0, sizeof(*b));
}

int ch_check_sources(PyObject *sources, Py_ssize_t nshards, const char *what)
{
    if (!PyList_Check(sources) && !PyTuple_Check(sources)) {
        PyErr_Format(PyExc_ValueError, "%s must be a list with one item per shard, got %.100s", what,
                     Py_TYPE(sources)->tp_name);
        return -1;
    }
    if (PySequence_Fast_GET_SIZE(sources) != nshards) {
        PyErr_Format(PyExc_ValueError, "%s has %zd items for %zd shards", what, PySequence_Fast_GET_SIZE(sources),
                     nshards);
        return -1;
    }
    return 0;
}

/* ------------------------------------------------------------------ held sources */

int ch_held_init(Held *h, Py_ssize_t nslots, int nbuf, unsigned optional)
{
    h->nslots = nslots;
    h->nbuf = nbuf;
    h->optional = optional;
    h->items = PyMem_Calloc((size_t)(nslots > 0 ? nslots : 1), sizeof(PyObject *));
    h->views = PyMem_Calloc((size_t)(nslots > 0 ? nslots : 1) * (size_t)nbuf, sizeof(Py_buffer));
    if (h->items == NULL || h->views == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    return 0;
}

int ch_held_take(PyObject *module, Held *h, const Batch *b, Py_ssize_t slot, PyObject *sources, const char *what)
{
    Py_ssize_t shard = b->shard[slot];
    /* Another thread may have replaced items (never the length of a tuple, but of a list
     * perhaps) while a buffer export ran Python code: ch_item_ref checks the bound every time. */
    PyObject *item = ch_item_ref(sources, shard, what);
    if (item == NULL)
        return -1;
    h->items[slot] = item;
    if (item == Py_None) {
        ch_raise_unmapped(module, shard);
        return -1;
    }
    if (h->nbuf == 1)
        return export(item, ch_held_view(h, slot, 0), PyBUF_SIMPLE, what, shard, -1);
    if (!PyTuple_Check(item) || PyTuple_GET_SIZE(item) != h->nbuf) {
        PyErr_Format(PyExc_ValueError, "%s[%zd] must be a tuple of %d buffers, got %.100s", what, shard, h->nbuf,
                     Py_TYPE(item)->tp_name);
        return -1;
    }
    for (int k = 0; k < h->nbuf; k++) {
        PyObject *element = PyTuple_GET_ITEM(item, k);
        if (element == Py_None && (h->optional & (1u << k)))
            continue;
        if (export(element, ch_held_view(h, slot, k), PyBUF_SIMPLE, what, shard, k) < 0)
            return -1;
    }
    return 0;
}

void ch_held_close(Held *h)
{
    if (h->views != NULL) {
        for (Py_ssize_t i = 0; i < h->nslots * h->nbuf; i++)
            ch_release(&h->views[i]);
    }
    if (h->items != NULL) {
        for (Py_ssize_t i = 0; i < h->nslots; i++)
            Py_XDECREF(h->items[i]);
    }
    PyMem_Free(h->items);
    PyMem_Free(h->views);
    memset(h, 0, sizeof(*h));
}

/* ------------------------------------------------------------------ text */

#define CH_HIGH_BITS UINT64_C(0x8080808080808080)

int ch_is_ascii(const char *p, Py_ssize_t n)
{
    uint64_t acc = 0;
    Py_ssize_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t w;
        memcpy(&w, p + i, 8);
        acc |= w;
    }
    if (i + 4 <= n) {
        uint32_t w;
        memcpy(&w, p + i, 4);
        acc |= w;
        i += 4;
    }
    for (; i < n; i++)
        acc |= (uint8_t)p[i];
    return (acc & CH_HIGH_BITS) == 0;
}

int ch_utf8_valid(const char *text, Py_ssize_t n)
{
    const uint8_t *s = (const uint8_t *)text;
    Py_ssize_t i = 0;
    while (i < n) {
        if (i + 8 <= n) {
            uint64_t w;
            memcpy(&w, s + i, 8);
            if ((w & CH_HIGH_BITS) == 0) {
                i += 8;
                continue;
            }
        }
        uint8_t c = s[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        Py_ssize_t len;
        uint8_t lo = 0x80, hi = 0xBF; /* allowed range of the second byte */
        if (c >= 0xC2 && c <= 0xDF)
            len = 2;
        else if (c >= 0xE0 && c <= 0xEF) {
            len = 3;
            if (c == 0xE0)
                lo = 0xA0; /* no overlong forms */
            else if (c == 0xED)
                hi = 0x9F; /* no surrogates */
        } else if (c >= 0xF0 && c <= 0xF4) {
            len = 4;
            if (c == 0xF0)
                lo = 0x90;
            else if (c == 0xF4)
                hi = 0x8F; /* nothing above U+10FFFF */
        } else
            return 0;
        if (n - i < len || s[i + 1] < lo || s[i + 1] > hi)
            return 0;
        for (Py_ssize_t k = 2; k < len; k++) {
            if ((s[i + k] & 0xC0) != 0x80)
                return 0;
        }
        i += len;
    }
    return 1;
}

PyObject *ch_make_str(const char *p, Py_ssize_t n)
{
    if (ch_is_ascii(p, n)) {
        PyObject *s = PyUnicode_New(n, 127);
        if (s != NULL)
            memcpy(PyUnicode_DATA(s), p, (size_t)n);
        return s;
    }
    return PyUnicode_DecodeUTF8(p, n, "strict");
}
