/* Python objects of a whole batch: strings/bytes of a binary column, dicts of a map column.
 *
 * Object creation needs the GIL, so these functions hold it; what they save is the
 * per-row interpreter work (one C loop instead of to_pylist's generic conversion). */
#include "native.h"

/* ------------------------------------------------------------------ value kinds */

typedef enum { KIND_STR, KIND_BYTES, KIND_INT64, KIND_FLOAT64 } Kind;

static int parse_kind(PyObject *obj, int allow_numbers, Kind *kind)
{
    static const char *const kinds[] = {"str", "bytes", "int64", "float64"};
    int count = allow_numbers ? 4 : 2;
    if (PyUnicode_Check(obj)) {
        const char *name = PyUnicode_AsUTF8(obj);
        if (name == NULL)
            return -1;
        for (int k = 0; k < count; k++) {
            if (strcmp(name, kinds[k]) == 0) {
                *kind = (Kind)k;
                return 0;
            }
        }
    }
    PyErr_Format(PyExc_ValueError, "kind must be %s, got %R",
                 allow_numbers ? "'str', 'bytes', 'int64' or 'float64'" : "'str' or 'bytes'", obj);
    return -1;
}

/* A new object of `kind` from a value's bytes; NULL with UnicodeDecodeError for a str that
 * is not UTF-8. */
static PyObject *make_value(Kind kind, const Span *value)
{
    switch (kind) {
    case KIND_STR: return ch_make_str(value->p, (Py_ssize_t)value->len);
    case KIND_BYTES: return PyBytes_FromStringAndSize(value->p, (Py_ssize_t)value->len);
    case KIND_INT64: return PyLong_FromLongLong(ch_ld64(value->p));
    case KIND_FLOAT64: {
        double d;
        memcpy(&d, value->p, 8);
        return PyFloat_FromDouble(d);
    }
    }
    return NULL;
}

/* Turns a UnicodeDecodeError into CorruptShard naming the shard and row. */
static void corrupt_text(PyObject *module, const Batch *b, Py_ssize_t i, const char *what)
{
    if (!PyErr_ExceptionMatches(PyExc_UnicodeDecodeError))
        return;
    PyErr_Clear();
    ch_raise_corrupt(module, b->shard[b->slot[i]], b->row[i], "%s is not valid UTF-8", what);
}

/* ------------------------------------------------------------------ map keys */

/* Rows of one map column usually repeat the same keys: a small direct-mapped cache of
 * the key objects made during one call skips their allocation and their hashing. */
#define KEY_CACHE_BITS 8

typedef struct {
    const char *p;
    int64_t len;
    PyObject *str;
} KeyCacheEntry;

typedef struct {
    KeyCacheEntry entries[1 << KEY_CACHE_BITS];
} KeyCache;

static inline size_t key_hash(const char *p, int64_t n)
{
    uint64_t a = 0, z = 0;
    if (n >= 8) {
        memcpy(&a, p, 8);
        memcpy(&z, p + n - 8, 8);
    } else {
        memcpy(&a, p, (size_t)n);
    }
    uint64_t h = (a ^ (uint64_t)n) * UINT64_C(0x9E3779B97F4A7C15) + z * UINT64_C(0xBF58476D1CE4E5B9);
    return (size_t)(h >> (64 - KEY_CACHE_BITS));
}

/* A new reference to the str of a key (NULL with UnicodeDecodeError if it is not UTF-8). */
static PyObject *key_object(KeyCache *cache, const Span *key)
{
    KeyCacheEntry *entry = &cache->entries[key_hash(key->p, key->len)];
    if (entry->str != NULL && entry->len == key->len && memcmp(entry->p, key->p, (size_t)key->len) == 0)
        return Py_NewRef(entry->str);
    PyObject *str = ch_make_str(key->p, (Py_ssize_t)key->len);
    if (str == NULL)
        return NULL;
    Py_XDECREF(entry->str);
    entry->str = Py_NewRef(str);
    entry->p = key->p;
    entry->len = key->len;
    return str;
}

static void key_cache_clear(KeyCache *cache)
{
    for (size_t k = 0; k < (1u << KEY_CACHE_BITS); k++)
        Py_CLEAR(cache->entries[k].str);
}

/* ------------------------------------------------------------------ take_objects */

PyObject *ch_take_objects(PyObject *module, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    static const char *const names[] = {"indices", "offsets", "sources", "kind", NULL};
    PyObject *a[4];
    if (ch_parse_args("take_objects", args, nargs, kwnames, names, 4, a) < 0)
        return NULL;
    Kind kind;
    if (parse_kind(a[3], 0, &kind) < 0)
        return NULL;
    Batch b;
    Held h;
    Span *spans = NULL;
    PyObject *list = NULL;
    if (ch_open_binary(module, &b, &h, a[0], a[1], a[2], 1, &spans) < 0)
        goto done;
    list = PyList_New(b.n);
    if (list == NULL)
        goto done;
    for (Py_ssize_t i = 0; i < b.n; i++) {
        PyObject *obj = make_value(kind, &spans[i]);
        if (obj == NULL) {
            corrupt_text(module, &b, i, "the value");
            Py_CLEAR(list);
            goto done;
        }
        PyList_SET_ITEM(list, i, obj);
    }
done:
    PyMem_Free(spans);
    ch_held_close(&h);
    ch_batch_close(&b);
    return list;
}

/* ------------------------------------------------------------------ dicts */

/* One dict of `count` entries; `values` holds either spans (values_list NULL) or the
 * objects of a list starting at `first`. */
static PyObject *make_dict(KeyCache *cache, const Span *keys, int64_t count, Kind kind, const Span *values,
                           PyObject *values_list, int64_t first, const char **failed)
{
    PyObject *dict = PyDict_New();
    if (dict == NULL)
        return NULL;
    for (int64_t j = 0; j < count; j++) {
        PyObject *key = key_object(cache, &keys[j]);
        if (key == NULL) {
            *failed = "a key";
            Py_DECREF(dict);
            return NULL;
        }
        PyObject *value;
        if (values_list != NULL)
            value = Py_NewRef(PyList_GET_ITEM(values_list, first + j));
        else
            value = make_value(kind, &values[j]);
        if (value == NULL) {
            *failed = "a value";
            Py_DECREF(key);
            Py_DECREF(dict);
            return NULL;
        }
        int status = PyDict_SetItem(dict, key, value);
        Py_DECREF(key);
        Py_DECREF(value);
        if (status < 0) {
            Py_DECREF(dict);
            return NULL;
        }
    }
    return dict;
}

PyObject *ch_take_dicts(PyObject *module, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    static const char *const names[] = {"indices", "offsets", "sources", "kind", NULL};
    PyObject *a[4];
    if (ch_parse_args("take_dicts", args, nargs, kwnames, names, 4, a) < 0)
        return NULL;
    Kind kind;
    if (parse_kind(a[3], 1, &kind) < 0)
        return NULL;
    int variable = kind == KIND_STR || kind == KIND_BYTES;
    Batch b;
    Held h;
    MapPlan plan;
    PyObject *list = NULL;
    KeyCache *cache = PyMem_Calloc(1, sizeof(KeyCache));
    if (cache == NULL)
        return PyErr_NoMemory();
    if (ch_open_map(module, &b, &h, a[0], a[1], a[2], variable, 8, &plan, &variable) < 0)
        goto done;
    list = PyList_New(b.n);
    if (list == NULL)
        goto done;
    for (Py_ssize_t i = 0; i < b.n; i++) {
        int64_t f = plan.first[i];
        const char *failed = NULL;
        PyObject *dict = make_dict(cache, plan.keys + f, plan.first[i + 1] - f, kind, plan.values + f, NULL, 0, &failed);
        if (dict == NULL) {
            corrupt_text(module, &b, i, failed != NULL ? failed : "a key");
            Py_CLEAR(list);
            goto done;
        }
        PyList_SET_ITEM(list, i, dict);
    }
done:
    key_cache_clear(cache);
    PyMem_Free(cache);
    ch_map_plan_free(&plan);
    ch_held_close(&h);
    ch_batch_close(&b);
    return list;
}

PyObject *ch_dicts_from_values(PyObject *module, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    (void)module;
    static const char *const names[] = {"entry_offsets", "key_offsets", "key_data", "values", NULL};
    PyObject *a[4];
    if (ch_parse_args("dicts_from_values", args, nargs, kwnames, names, 4, a) < 0)
        return NULL;
    Py_buffer eo_view = {0}, ko_view = {0}, kd_view = {0};
    int64_t *first = NULL;
    Span *keys = NULL;
    PyObject *values = NULL, *list = NULL;
    KeyCache *cache = NULL;
    Py_ssize_t n_eo, n_ko;
    if (ch_int_buffer(a[0], &eo_view, 4, 0, 1, "entry_offsets", &n_eo) < 0 ||
        ch_int_buffer(a[1], &ko_view, 8, 0, 1, "key_offsets", &n_ko) < 0 ||
        ch_byte_buffer(a[2], &kd_view, 0, "key_data") < 0)
        goto done;
    if (!PyList_Check(a[3])) {
        PyErr_Format(PyExc_ValueError, "values must be a list with one object per entry, got %.100s",
                     Py_TYPE(a[3])->tp_name);
        goto done;
    }
    /* A copy: the list must not change length while the dicts are built. */
    values = PyList_GetSlice(a[3], 0, PyList_GET_SIZE(a[3]));
    if (values == NULL)
        goto done;
    Py_ssize_t m = PyList_GET_SIZE(values);
    if (n_eo < 1) {
        PyErr_SetString(PyExc_ValueError, "entry_offsets must hold n + 1 entries for n rows, got none");
        goto done;
    }
    Py_ssize_t n = n_eo - 1;
    first = PyMem_Malloc((size_t)n_eo * sizeof(int64_t));
    keys = PyMem_Malloc((size_t)(m > 0 ? m : 1) * sizeof(Span));
    cache = PyMem_Calloc(1, sizeof(KeyCache));
    if (first == NULL || keys == NULL || cache == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i <= n; i++) {
        first[i] = ch_ld32((const char *)eo_view.buf + 4 * i);
        if ((i == 0 && first[0] != 0) || (i > 0 && first[i] < first[i - 1]) || first[i] > m) {
            PyErr_Format(PyExc_ValueError,
                         "entry_offsets[%zd] = %lld: entry offsets must start at 0, not decrease and not exceed "
                         "the %zd values",
                         i, (long long)first[i], m);
            goto done;
        }
    }
    if (first[n] != m) {
        PyErr_Format(PyExc_ValueError, "values holds %zd objects for %lld map entries", m, (long long)first[n]);
        goto done;
    }
    if (n_ko < m + 1) {
        PyErr_Format(PyExc_ValueError, "key_offsets holds %zd entries, needs %zd for %zd keys", n_ko, m + 1, m);
        goto done;
    }
    int64_t start = ch_ld64(ko_view.buf);
    for (Py_ssize_t e = 0; e < m; e++) {
        int64_t stop = ch_ld64((const char *)ko_view.buf + 8 * (e + 1));
        if (start < 0 || stop < start || stop > kd_view.len) {
            PyErr_Format(PyExc_ValueError,
                         "key_offsets %lld, %lld of entry %zd are negative, decreasing or beyond key_data (%zd bytes)",
                         (long long)start, (long long)stop, e, kd_view.len);
            goto done;
        }
        keys[e].p = (const char *)kd_view.buf + start;
        keys[e].len = stop - start;
        start = stop;
    }
    list = PyList_New(n);
    if (list == NULL)
        goto done;
    for (Py_ssize_t i = 0; i < n; i++) {
        const char *failed = NULL;
        PyObject *dict = make_dict(cache, keys + first[i], first[i + 1] - first[i], KIND_STR, NULL, values, first[i],
                                   &failed);
        if (dict == NULL) {
            if (PyErr_ExceptionMatches(PyExc_UnicodeDecodeError)) {
                PyErr_Clear();
                PyErr_Format(PyExc_ValueError, "a key of row %zd is not valid UTF-8", i);
            }
            Py_CLEAR(list);
            goto done;
        }
        PyList_SET_ITEM(list, i, dict);
    }
done:
    if (cache != NULL)
        key_cache_clear(cache);
    PyMem_Free(cache);
    PyMem_Free(first);
    PyMem_Free(keys);
    Py_XDECREF(values);
    ch_release(&eo_view);
    ch_release(&ko_view);
    ch_release(&kd_view);
    return list;
}
