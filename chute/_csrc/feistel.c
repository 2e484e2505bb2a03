/* feistel: chute.order's keyed permutation of range(n), without temporary arrays. */
#include "native.h"

#define ROUNDS 6
/* Candidates computed per block before the ones below n are kept. */
#define BLOCK 1024

/* splitmix64's finaliser of x ^ key (chute.order._mix). */
static inline uint64_t mix(uint64_t x, uint64_t key)
{
    x ^= key;
    x = (x ^ (x >> 30)) * UINT64_C(0xBF58476D1CE4E5B9);
    x = (x ^ (x >> 27)) * UINT64_C(0x94D049BB133111EB);
    return x ^ (x >> 31);
}

/* The balanced Feistel network on [0, 4**half) maps v to a value; the values below n,
 * in the order of v, are the permutation. Returns how many were written (n). */
static int64_t permute(int64_t n, int half, const uint64_t *keys, char *out)
{
    const uint64_t mask = (UINT64_C(1) << half) - 1, domain = UINT64_C(1) << (2 * half);
    uint64_t block[BLOCK];
    int64_t written = 0;
    for (uint64_t start = 0; start < domain && written < n; start += BLOCK) {
        uint64_t stop = domain - start < BLOCK ? domain : start + BLOCK;
        size_t kept = 0;
        for (uint64_t v = start; v < stop; v++) {
            uint64_t left = v >> half, right = v & mask;
            for (int r = 0; r < ROUNDS; r++) {
                uint64_t next = left ^ (mix(right, keys[r]) & mask);
                left = right;
                right = next;
            }
            uint64_t x = (left << half) | right;
            block[kept] = x;
            kept += x < (uint64_t)n; /* branch-free: about half the candidates are dropped */
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
