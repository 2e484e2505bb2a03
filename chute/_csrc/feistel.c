/* chute.order's kernels: the keyed permutation of range(n) (without temporary arrays), and each batch's rows
 * grouped by shard. */
#include "native.h"

#define ROUNDS 6
/* Candidates computed per block before the ones below n are kept. */
#define BLOCK 1024
/* Values computed side by side (BLOCK is a multiple). */
#define LANES 8

/* splitmix64's finaliser of x ^ key (chute.order._mix). */
static inline uint64_t mix(uint64_t x, uint64_t key)
{
    x ^= key;
    x = (x ^ (x >> 30)) * UINT64_C(0xBF58476D1CE4E5B9);
    x = (x ^ (x >> 27)) * UINT64_C(0x94D049BB133111EB);
    return x ^ (x >> 31);
}

/* The balanced Feistel network on [0, 4**half), one value. */
static inline uint64_t network(uint64_t v, int half, uint64_t mask, const uint64_t *keys)
{
    uint64_t left = v >> half, right = v & mask;
    for (int r = 0; r < ROUNDS; r++) {
        uint64_t next = left ^ (mix(right, keys[r]) & mask);
        left = right;
        right = next;
    }
    return (left << half) | right;
}

/* The network maps v to a value; the values below n, in the order of v, are the permutation. Returns how many
 * were written (n). LANES values go through the rounds side by side: each round of one value waits on its
 * multiplies, and independent values keep the multiplier busy meanwhile (the same values, faster than one
 * value at a time: docs/benchmarks.md, "What bounds W2"). */
static int64_t permute(int64_t n, int half, const uint64_t *keys, char *out)
{
    const uint64_t mask = (UINT64_C(1) << half) - 1, domain = UINT64_C(1) << (2 * half);
    uint64_t block[BLOCK];
    int64_t written = 0;
    for (uint64_t start = 0; start < domain && written < n; start += BLOCK) {
        uint64_t stop = domain - start < BLOCK ? domain : start + BLOCK;
        size_t kept = 0;
        uint64_t v = start;
        for (; v + LANES <= stop; v += LANES) {
            uint64_t left[LANES], right[LANES];
            for (int j = 0; j < LANES; j++) {
                left[j] = (v + (uint64_t)j) >> half;
                right[j] = (v + (uint64_t)j) & mask;
            }
            for (int r = 0; r < ROUNDS; r++) {
                for (int j = 0; j < LANES; j++) {
                    uint64_t next = left[j] ^ (mix(right[j], keys[r]) & mask);
                    left[j] = right[j];
                    right[j] = next;
                }
            }
            for (int j = 0; j < LANES; j++) {
                uint64_t x = (left[j] << half) | right[j];
                block[kept] = x;
                kept += x < (uint64_t)n; /* branch-free: about half the candidates are dropped */
            }
        }
        for (; v < stop; v++) { /* (a domain under LANES values) */
            uint64_t x = network(v, half, mask, keys);
            block[kept] = x;
            kept += x < (uint64_t)n;
        }
        if ((int64_t)kept > n - written)
            kept = (size_t)(n - written); /* impossible for a bijection; keeps the write in bounds */
        memcpy(out + 8 * written, block, kept * 8);
        written += (int64_t)kept;
    }
    return written;
}

PyObject *ch_feistel(PyObject *module, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    (void)module;
    static const char *const names[] = {"n", "half", "round_keys", "out", NULL};
    PyObject *a[4];
    if (ch_parse_args("feistel", args, nargs, kwnames, names, 4, a) < 0)
        return NULL;
    int64_t n, half;
    if (ch_int_arg(a[0], 0, INT64_MAX, "n", &n) < 0 || ch_int_arg(a[1], 1, 31, "half", &half) < 0)
        return NULL;
    if (n > (INT64_C(1) << (2 * half))) {
        PyErr_Format(PyExc_ValueError, "half = %lld covers 4**half = %lld values, fewer than n = %lld", (long long)half,
                     (long long)(INT64_C(1) << (2 * half)), (long long)n);
        return NULL;
    }
    PyObject *seq = PySequence_Tuple(a[2]); /* private: nothing can change it while it is read */
    if (seq == NULL) {
        PyErr_SetString(PyExc_ValueError, "round_keys must be a sequence of 6 ints in [0, 2**64)");
        return NULL;
    }
    uint64_t keys[ROUNDS];
    int bad = PyTuple_GET_SIZE(seq) != ROUNDS;
    for (int r = 0; !bad && r < ROUNDS; r++) {
        PyObject *item = PyTuple_GET_ITEM(seq, r);
        bad = !PyLong_Check(item);
        if (!bad) {
            keys[r] = PyLong_AsUnsignedLongLong(item);
            bad = keys[r] == (uint64_t)-1 && PyErr_Occurred();
            PyErr_Clear();
        }
    }
    Py_DECREF(seq);
    if (bad) {
        PyErr_SetString(PyExc_ValueError, "round_keys must be a sequence of 6 ints in [0, 2**64)");
        return NULL;
    }
    Py_buffer out;
    Py_ssize_t count;
    if (ch_int_buffer(a[3], &out, 8, 1, 1, "out", &count) < 0)
        return NULL;
    if (count != n) {
        PyErr_Format(PyExc_ValueError, "out holds %zd int64, needs n = %lld", count, (long long)n);
        ch_release(&out);
        return NULL;
    }
    int64_t written;
    Py_BEGIN_ALLOW_THREADS
    written = permute(n, (int)half, keys, out.buf);
    Py_END_ALLOW_THREADS
    ch_release(&out);
    if (written != n) {
        PyErr_Format(PyExc_RuntimeError, "the Feistel network gave %lld values below n = %lld", (long long)written,
                     (long long)n);
        return NULL;
    }
    return Py_NewRef(Py_None);
}

/* ------------------------------------------------------------------ rows grouped by shard */

/* The shard bucket of v: how many offsets are <= v (numpy's searchsorted(offsets, v, side="right")), for sorted
 * offsets. Branch-free (the compiler makes the choice a conditional move): a batch's rows come in random order,
 * so a branch per step would be mispredicted half the time. */
static inline uint32_t bucket_of(const int64_t *offsets, int64_t count, int64_t v)
{
    const int64_t *base = offsets;
    int64_t n = count;
    while (n > 1) {
        int64_t half = n / 2;
        base = base[half] <= v ? base + half : base;
        n -= half;
    }
    return (uint32_t)((base - offsets) + (*base <= v));
}

/* The widest span of buckets one row may cover for the counting sort; beyond, the row is merge-sorted. */
#define SPAN 1024

/* One row of `width` values into `out`, stably ordered by bucket. `keys` and `tmp`: `width` items of scratch;
 * `counts`: SPAN items. */
static void group_row(const int64_t *row, int64_t width, const int64_t *offsets, int64_t noffsets, int64_t *out,
                      uint64_t *keys, uint64_t *tmp, int64_t *counts)
{
    uint32_t low = UINT32_MAX, high = 0, last = 0;
    int64_t descents = 0;
    for (int64_t j = 0; j < width; j++) {
        uint32_t b = bucket_of(offsets, noffsets, row[j]);
        keys[j] = ((uint64_t)b << 32) | (uint64_t)j; /* unique keys: any sort of them is stable */
        descents += b < last;
        last = b;
        low = b < low ? b : low;
        high = b > high ? b : high;
    }
    if (descents == 0) { /* already grouped (a single shard, or rows read in order) */
        memcpy(out, row, (size_t)width * 8);
        return;
    }
    if (high - low < SPAN) { /* counting sort over the buckets the row covers */
        int64_t span = (int64_t)(high - low) + 1;
        memset(counts, 0, (size_t)span * sizeof(int64_t));
        for (int64_t j = 0; j < width; j++)
            counts[(keys[j] >> 32) - low]++;
        int64_t at = 0;
        for (int64_t k = 0; k < span; k++) { /* counts become each bucket's first place */
            int64_t c = counts[k];
            counts[k] = at;
            at += c;
        }
        for (int64_t j = 0; j < width; j++)
            out[counts[(keys[j] >> 32) - low]++] = row[j];
        return;
    }
    /* bottom-up merge sort of the keys */
    uint64_t *a = keys, *b = tmp;
    for (int64_t run = 1; run < width; run *= 2) {
        for (int64_t lo = 0; lo < width; lo += 2 * run) {
            int64_t mid = lo + run < width ? lo + run : width, hi = lo + 2 * run < width ? lo + 2 * run : width;
            int64_t i = lo, k = mid, o = lo;
            while (i < mid && k < hi)
                b[o++] = a[i] <= a[k] ? a[i++] : a[k++];
            while (i < mid)
                b[o++] = a[i++];
            while (k < hi)
                b[o++] = a[k++];
        }
        uint64_t *t = a;
        a = b;
        b = t;
    }
    for (int64_t j = 0; j < width; j++)
        out[j] = row[a[j] & UINT64_C(0xFFFFFFFF)];
}

PyObject *ch_group_by_shard(PyObject *module, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    (void)module;
    static const char *const names[] = {"rows", "width", "offsets", "out", NULL};
    PyObject *a[4];
    if (ch_parse_args("group_by_shard", args, nargs, kwnames, names, 4, a) < 0)
        return NULL;
    int64_t width;
    if (ch_int_arg(a[1], 1, UINT32_MAX, "width", &width) < 0)
        return NULL;
    Py_buffer rows, offsets, out;
    Py_ssize_t n, noffsets, nout;
    if (ch_int_buffer(a[0], &rows, 8, 0, 1, "rows", &n) < 0)
        return NULL;
    if (ch_int_buffer(a[2], &offsets, 8, 0, 1, "offsets", &noffsets) < 0) {
        ch_release(&rows);
        return NULL;
    }
    if (ch_int_buffer(a[3], &out, 8, 1, 1, "out", &nout) < 0) {
        ch_release(&rows);
        ch_release(&offsets);
        return NULL;
    }
    const char *problem = NULL;
    if (n % width != 0)
        problem = "rows does not hold a whole number of rows of width values";
    else if (nout != n)
        problem = "out does not hold as many values as rows";
    else if (noffsets < 1 || noffsets > INT32_MAX)
        problem = "offsets must hold S + 1 entries for S shards (S < 2**31)";
    else if (n > 0 && (char *)out.buf < (char *)rows.buf + rows.len && (char *)rows.buf < (char *)out.buf + out.len)
        problem = "out overlaps rows: a row's values are read again while it is written";
    uint64_t *scratch = NULL;
    if (problem == NULL && n > 0 && (scratch = PyMem_RawMalloc(((size_t)width * 2 + SPAN) * sizeof(uint64_t))) == NULL)
        problem = "";
    if (problem == NULL) {
        const int64_t *src = rows.buf, *offs = offsets.buf;
        int64_t *dst = out.buf;
        Py_BEGIN_ALLOW_THREADS
        for (Py_ssize_t r = 0; r < n / width; r++)
            group_row(src + r * width, width, offs, noffsets, dst + r * width, scratch, scratch + width,
                      (int64_t *)(scratch + 2 * width));
        Py_END_ALLOW_THREADS
    }
    PyMem_RawFree(scratch);
    ch_release(&rows);
    ch_release(&offsets);
    ch_release(&out);
    if (problem != NULL) {
        if (problem[0] == '\0')
            return PyErr_NoMemory();
        PyErr_SetString(PyExc_ValueError, problem);
        return NULL;
    }
    return Py_NewRef(Py_None);
}
