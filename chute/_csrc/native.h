/* Shared declarations of chute._native: argument parsing, buffers, errors, the batch plan.
 *
 * Every function of the module follows the same discipline:
 *   1. parse the arguments and export the caller's buffers (ValueError on bad arguments);
 *   2. resolve each index to (shard, row) once, into private memory (IndexError);
 *   3. export the buffers of every shard the batch needs and keep them for the whole
 *      call, so a thread that unmaps a shard meanwhile cannot free them (Unmapped);
 *   4. read every value that comes from a shard exactly once, validate it and keep
 *      the validated copy (CorruptShard);
 *   5. only then copy, from the validated private values, with the GIL released
 *      when the copy is big enough to be worth it.
 * Nothing is written to the caller's buffers, nor returned, unless every check passed.
 */
#ifndef CHUTE_NATIVE_H
#define CHUTE_NATIVE_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

/* The x86-64 SIMD kernels (planes: SSSE3; resample: SSE4.1 and AVX2, and the vertical pass cloned for
 * AVX2), each chosen at run time by what the CPU supports. -DCHUTE_NO_SIMD compiles them all out, leaving
 * the portable code every other machine runs (CI builds chute._native that way to test it). */
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && !defined(CHUTE_NO_SIMD)
#define CH_X86_SIMD 1
#endif

#if defined(__GNUC__) || defined(__clang__)
#define CH_UNLIKELY(x) __builtin_expect(!!(x), 0)
#else
#define CH_UNLIKELY(x) (x)
#endif

/* Copies smaller than this keep the GIL: releasing it costs a possible wait of a whole
 * switch interval (5 ms by default) to take it back from a busy Python thread, while
 * copying 64 KiB takes a few microseconds. */
#define CH_RELEASE_GIL_BYTES ((int64_t)64 << 10)

/* Unaligned little-endian loads: Arrow and bytes buffers give no alignment guarantee
 * to a slice. memcpy of a constant size compiles to one mov. */
static inline int64_t ch_ld64(const char *p)
{
    int64_t v;
    memcpy(&v, p, 8);
    return v;
}

static inline int32_t ch_ld32(const char *p)
{
    int32_t v;
    memcpy(&v, p, 4);
    return v;
}

/* a * b for non-negative a and b; 1 when it overflows int64. */
static inline int ch_mul_overflow(int64_t a, int64_t b, int64_t *out)
{
#if defined(__GNUC__) || defined(__clang__)
    return __builtin_mul_overflow(a, b, out);
#else
    if (a != 0 && b > INT64_MAX / a)
        return 1;
    *out = a * b;
    return 0;
#endif
}

/* a + b for non-negative a and b; 1 when it overflows int64. */
static inline int ch_add_overflow(int64_t a, int64_t b, int64_t *out)
{
#if defined(__GNUC__) || defined(__clang__)
    return __builtin_add_overflow(a, b, out);
#else
    if (b > INT64_MAX - a)
        return 1;
    *out = a + b;
    return 0;
#endif
}

/* The module's state: its two exception classes. */
typedef struct {
    PyObject *unmapped;
    PyObject *corrupt;
} NativeState;

NativeState *ch_state(PyObject *module);

/* ------------------------------------------------------------------ arguments */

/* Positional-or-keyword parsing of a METH_FASTCALL | METH_KEYWORDS call. `names` ends
 * with NULL; the first `nrequired` are required, the others are left NULL when absent. */
int ch_parse_args(const char *fname, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames,
                  const char *const *names, Py_ssize_t nrequired, PyObject **out);

/* A Python int in [lo, hi] as int64 (ValueError naming `what` otherwise). */
int ch_int_arg(PyObject *obj, int64_t lo, int64_t hi, const char *what, int64_t *out);

/* An int64 (itemsize 8) or int32 (itemsize 4) C-contiguous buffer, or a raw byte buffer
 * read as such; `*count` is its number of items. With `exact`, a byte buffer whose size
 * is not a multiple of the item size is refused (else the tail is ignored). */
int ch_int_buffer(PyObject *obj, Py_buffer *view, int itemsize, int writable, int exact,
                  const char *what, Py_ssize_t *count);

/* Any C-contiguous buffer, as bytes. */
int ch_byte_buffer(PyObject *obj, Py_buffer *view, int writable, const char *what);

/* A new reference to item i of a list or tuple of sources, or NULL with ValueError naming `what` when
 * the item is gone (a list that shrank while a buffer export ran Python code). Another thread may
 * replace a list's items meanwhile (a shard unmapped): the GIL makes the read and the new reference one
 * step, and where there may be no GIL (3.13+, free-threaded builds) PyList_GetItemRef takes the item
 * under the list's lock. A borrowed reference would not do there. */
static inline PyObject *ch_item_ref(PyObject *seq, Py_ssize_t i, const char *what)
{
#if PY_VERSION_HEX >= 0x030D0000
    if (PyList_Check(seq)) {
        PyObject *item = PyList_GetItemRef(seq, i);
        if (item != NULL || !PyErr_ExceptionMatches(PyExc_IndexError))
            return item;
        PyErr_Clear();
        i = -1; /* gone */
    }
#endif
    if (i >= 0 && i < PySequence_Fast_GET_SIZE(seq))
        return Py_NewRef(PySequence_Fast_GET_ITEM(seq, i));
    PyErr_Format(PyExc_ValueError, "%s lost an item during the call", what);
    return NULL;
}

static inline void ch_release(Py_buffer *view)
{
    if (view->obj != NULL)
        PyBuffer_Release(view);
    view->obj = NULL;
}

/* ------------------------------------------------------------------ errors */

PyObject *ch_raise_unmapped(PyObject *module, Py_ssize_t shard);
PyObject *ch_raise_corrupt(PyObject *module, Py_ssize_t shard, int64_t row, const char *fmt, ...);

/* ------------------------------------------------------------------ the batch plan */

/* The indices of one call resolved against the shard offsets. Each index gets a slot (the
 * key of the per-shard arrays of a call) and its row; `order` lists the slots the batch
 * touches, by ascending shard number. */
typedef struct {
    Py_buffer indices_view;
    Py_buffer offsets_view;
    Py_ssize_t n;         /* number of indices */
    Py_ssize_t nshards;   /* S */
    int64_t *offsets;     /* private copy of the validated offsets, S + 1 entries */
    int32_t *slot;        /* per index */
    int64_t *row;         /* per index: row within its shard */
    Py_ssize_t nslots;    /* size of the per-slot arrays */
    int32_t *shard;       /* per slot: shard number */
    int64_t *rows;        /* per slot: the shard's row count */
    Py_ssize_t ntouched;  /* slots the batch touches */
    int32_t *order;       /* the touched slots, by ascending shard number */
} Batch;

/* Exports the indices and offsets buffers and validates the offsets (ValueError). */
int ch_batch_open(Batch *b, PyObject *indices, PyObject *offsets);
/* Resolves every index (IndexError for one out of range); assigns the slots. */
int ch_batch_resolve(Batch *b);
void ch_batch_close(Batch *b);

/* A sources list must have one item per shard. */
int ch_check_sources(PyObject *sources, Py_ssize_t nshards, const char *what);

/* The buffers of the shards one sources list provides, held for the whole call.
 * Each item is a buffer (nbuf == 1) or a tuple of nbuf buffers; the elements whose bit
 * is set in `optional` may be None (their view keeps obj == NULL). */
typedef struct {
    Py_ssize_t nslots;
    int nbuf;
    unsigned optional;
    PyObject **items;  /* per slot: a reference to the list item, NULL until taken */
    Py_buffer *views;  /* per slot, nbuf views */
} Held;

int ch_held_init(Held *h, Py_ssize_t nslots, int nbuf, unsigned optional);
/* Takes the item of slot `slot` from `sources` and exports its buffers. Raises
 * Unmapped if it is None, ValueError if it is not the expected buffer(s). */
int ch_held_take(PyObject *module, Held *h, const Batch *b, Py_ssize_t slot, PyObject *sources,
                 const char *what);
void ch_held_close(Held *h);

static inline Py_buffer *ch_held_view(const Held *h, Py_ssize_t slot, int k)
{
    return &h->views[slot * h->nbuf + k];
}

/* ------------------------------------------------------------------ variable-length rows */

/* Bytes of one value in a shard's held buffer. */
typedef struct {
    const char *p;
    int64_t len;
} Span;

/* Per index, the validated bytes of its row in a binary column whose held sources are
 * (value_offsets int64, data) with values of item_size bytes. */
int ch_binary_spans(PyObject *module, const Batch *b, const Held *h, int64_t item_size, Span *spans);

/* The validated entries of the rows of a map column whose held sources are
 * (entry_offsets int32, key_offsets int64, key_data, value_offsets int64 or None, value_data). */
typedef struct {
    Py_ssize_t nentries;
    int64_t *first; /* n + 1: row i's entries are [first[i], first[i + 1]) */
    Span *keys;     /* per entry */
    Span *values;   /* per entry: a variable value's bytes, or the fixed value's value_size bytes */
} MapPlan;

/* `variable`: values have offsets (every touched shard must then give value_offsets) or
 * are fixed-size items of value_size bytes (every touched shard must give None). */
int ch_map_plan(PyObject *module, const Batch *b, const Held *h, int variable, int64_t value_size, MapPlan *plan);
void ch_map_plan_free(MapPlan *plan);

/* Opens the batch and takes the sources of a binary column, then its validated spans. */
int ch_open_binary(PyObject *module, Batch *b, Held *h, PyObject *indices, PyObject *offsets, PyObject *sources,
                   int64_t item_size, Span **spans);
/* Opens the batch and takes the sources of a map column, then its plan. `variable` < 0:
 * decided by the first touched shard (or the first mapped one when none is touched). */
int ch_open_map(PyObject *module, Batch *b, Held *h, PyObject *indices, PyObject *offsets, PyObject *sources,
                int variable, int64_t value_size, MapPlan *plan, int *variable_out);

/* ------------------------------------------------------------------ text */

int ch_is_ascii(const char *p, Py_ssize_t n);
int ch_utf8_valid(const char *p, Py_ssize_t n);
/* A str from UTF-8 bytes known to be valid or to be checked by the caller's error path:
 * returns NULL with UnicodeDecodeError set when they are not valid UTF-8. */
PyObject *ch_make_str(const char *p, Py_ssize_t n);

/* ------------------------------------------------------------------ shared by the kernels and the ring */

/* Row i of dst = row row[i] (rows of rb bytes) of the shard whose first row base[slot[i]] is (gather.c). */
void ch_copy_rows(char *dst, const char *const *base, const int32_t *slot, const int64_t *row, Py_ssize_t n, int64_t rb);

/* The calling thread's scheduling class, 0 (SCHED_OTHER) or 3 (SCHED_BATCH), and time slice (sched.c); whether
 * it was set. Needs no GIL. */
int ch_set_thread_class(int policy, int64_t slice_ns);

/* The GatherRing type (ring.c), added to the module at import. */
int ch_add_ring_type(PyObject *module);

/* ------------------------------------------------------------------ the module's functions */

PyObject *ch_gather(PyObject *module, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames);
PyObject *ch_gather_binary(PyObject *module, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames);
PyObject *ch_gather_map(PyObject *module, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames);
PyObject *ch_join_json(PyObject *module, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames);
PyObject *ch_take_objects(PyObject *module, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames);
PyObject *ch_take_dicts(PyObject *module, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames);
PyObject *ch_dicts_from_values(PyObject *module, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames);
PyObject *ch_feistel(PyObject *module, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames);
PyObject *ch_group_by_shard(PyObject *module, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames);
PyObject *ch_thread_class(PyObject *module, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames);
PyObject *ch_planes(PyObject *module, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames);
PyObject *ch_resample(PyObject *module, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames);
PyObject *ch_tokens_window(PyObject *module, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames);
PyObject *ch_tokens_plan(PyObject *module, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames);
PyObject *ch_tokens_packed(PyObject *module, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames);

#endif
