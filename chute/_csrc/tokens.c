/* Token sequences: fixed-length training samples cut from token shards (chute.tokens).
 *
 *   tokens_window  pack="concat": window i is stream[i*L : i*L + L + 1] of the shards' tokens
 *                  one after the other; input_ids its first L, labels its last L.
 *   tokens_plan    pack="documents": the sequences of one shard (next-fit packing of its
 *                  documents in order), as the L-token-or-shorter ranges that tile its tokens.
 *   tokens_packed  pack="documents": rows of those sequences, padded, with labels, position
 *                  ids and the flattened batch's cu_seqlens.
 *
 * Tokens are stored as uint16 or uint32 (itemsize 2 or 4) and come out as int64. The same
 * discipline as the other kernels: every shard a call needs is exported (Unmapped for the
 * lowest one that is None) and checked before anything is written, and the copy runs with
 * the GIL released when it is big enough.
 */
#include "native.h"

/* dst[j] = tokens[pos + j] for j < count, widening uint16/uint32 to int64. */
static inline void widen(int64_t *restrict dst, const char *base, int64_t pos, int64_t count, int itemsize)
{
    if (itemsize == 2) {
        const uint16_t *restrict src = (const uint16_t *)(const void *)base + pos;
        for (int64_t j = 0; j < count; j++)
            dst[j] = src[j];
    } else {
        const uint32_t *restrict src = (const uint32_t *)(const void *)base + pos;
        for (int64_t j = 0; j < count; j++)
            dst[j] = src[j];
    }
}

/* dst[j] = start + j for j < count. */
static inline void iota(int64_t *restrict dst, int64_t start, int64_t count)
{
    for (int64_t j = 0; j < count; j++)
        dst[j] = start + j;
}

/* dst[j] = value for j < count. */
static inline void fill(int64_t *restrict dst, int64_t value, int64_t count)
{
    for (int64_t j = 0; j < count; j++)
        dst[j] = value;
}

/* The shard holding stream position `pos` (starts[k] <= pos < starts[k + 1]; the last
 * non-empty one for pos == starts[S]). `starts` is nondecreasing, starts[0] == 0. */
static Py_ssize_t shard_of(const int64_t *starts, Py_ssize_t nshards, int64_t pos)
{
    Py_ssize_t lo = 0, hi = nshards; /* invariant: starts[lo] <= pos, answer in [lo, hi) */
    while (hi - lo > 1) {
        Py_ssize_t mid = lo + (hi - lo) / 2;
        if (starts[mid] <= pos)
            lo = mid;
        else
            hi = mid;
    }
    while (lo + 1 < nshards && starts[lo + 1] <= pos)
        lo++;
    return lo;
}

/* Reads and checks a nondecreasing int64 offsets argument starting at 0 into private memory. */
static int64_t *private_starts(PyObject *obj, Py_buffer *view, const char *what, Py_ssize_t *nshards)
{
    Py_ssize_t count;
    if (ch_int_buffer(obj, view, 8, 0, 1, what, &count) < 0)
        return NULL;
    if (count < 1) {
        PyErr_Format(PyExc_ValueError, "%s must hold S + 1 entries for S shards", what);
        return NULL;
    }
    int64_t *out = PyMem_Malloc((size_t)count * sizeof(int64_t));
    if (out == NULL) {
        PyErr_NoMemory();
        return NULL;
    }
    const char *p = view->buf;
    for (Py_ssize_t s = 0; s < count; s++) {
        out[s] = ch_ld64(p + 8 * s);
        if ((s == 0 && out[s] != 0) || (s > 0 && out[s] < out[s - 1])) {
            PyErr_Format(PyExc_ValueError, "%s must start at 0 and never decrease (entry %zd)", what, s);
            PyMem_Free(out);
            return NULL;
        }
    }
    *nshards = count - 1;
    return out;
}

/* A shard's token source for tokens_window: a (tokens, base) tuple. Exports tokens into
 * *view and checks it holds `count` items from item `base`. */
static int take_window_source(PyObject *module, PyObject *item, Py_ssize_t shard, int64_t count, int itemsize,
                              Py_buffer *view, int64_t *base)
{
    if (item == Py_None) {
        ch_raise_unmapped(module, shard);
        return -1;
    }
    if (!PyTuple_Check(item) || PyTuple_GET_SIZE(item) != 2) {
        PyErr_Format(PyExc_ValueError, "sources[%zd] must be None or a (tokens, base) tuple, got %.100s", shard,
                     Py_TYPE(item)->tp_name);
        return -1;
    }
    if (ch_int_arg(PyTuple_GET_ITEM(item, 1), 0, INT64_MAX / 8, "base", base) < 0)
        return -1;
    if (PyObject_GetBuffer(PyTuple_GET_ITEM(item, 0), view, PyBUF_SIMPLE) < 0) {
        view->obj = NULL;
        return -1;
    }
    /* Items [base, base + count) must lie in the buffer: base + count and its size in bytes computed with
     * the overflow helpers, as a starts array or a base from outside may be any int64. */
    int64_t end, need;
    if (ch_add_overflow(*base, count, &end) || ch_mul_overflow(end, itemsize, &need) || need > (int64_t)view->len) {
        ch_raise_corrupt(module, shard, -1, "holds %zd bytes of tokens, too few for %lld tokens from token %lld",
                         view->len, (long long)count, (long long)*base);
        return -1;
    }
    return 0;
}

PyObject *ch_tokens_window(PyObject *module, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    static const char *const names[] = {"indices", "seq_len", "starts", "sources", "itemsize", "input_ids", "labels", NULL};
    PyObject *a[7];
    if (ch_parse_args("tokens_window", args, nargs, kwnames, names, 7, a) < 0)
        return NULL;
    Py_buffer iv = {0}, sv = {0}, inv = {0}, lv = {0};
    Py_buffer *views = NULL;
    int64_t *starts = NULL, *bases = NULL, *first = NULL;
    char *needed = NULL;
    Py_ssize_t n = 0, nshards = 0, count;
    int64_t seq_len, itemsize;
    PyObject *result = NULL;
    if (ch_int_arg(a[1], 1, INT32_MAX, "seq_len", &seq_len) < 0 || ch_int_arg(a[4], 2, 4, "itemsize", &itemsize) < 0)
        goto done;
    if (itemsize == 3) {
        PyErr_SetString(PyExc_ValueError, "itemsize must be 2 (uint16) or 4 (uint32)");
        goto done;
    }
    if (ch_int_buffer(a[0], &iv, 8, 0, 1, "indices", &n) < 0)
        goto done;
    if ((starts = private_starts(a[2], &sv, "starts", &nshards)) == NULL)
        goto done;
    if (ch_check_sources(a[3], nshards, "sources") < 0)
        goto done;
    int64_t values; /* n x L, the size of each output */
    if (ch_mul_overflow((int64_t)n, seq_len, &values)) {
        PyErr_Format(PyExc_ValueError, "%zd windows of %lld tokens do not fit an int64 count", n, (long long)seq_len);
        goto done;
    }
    if (ch_int_buffer(a[5], &inv, 8, 1, 1, "input_ids", &count) < 0)
        goto done;
    if (count != values) {
        PyErr_Format(PyExc_ValueError, "input_ids holds %zd values, needs %zd x %lld", count, n, (long long)seq_len);
        goto done;
    }
    if (ch_int_buffer(a[6], &lv, 8, 1, 1, "labels", &count) < 0)
        goto done;
    if (count != values) {
        PyErr_Format(PyExc_ValueError, "labels holds %zd values, needs %zd x %lld", count, n, (long long)seq_len);
        goto done;
    }
    size_t ns = (size_t)(nshards > 0 ? nshards : 1);
    first = PyMem_Malloc((size_t)(n > 0 ? n : 1) * sizeof(int64_t));
    needed = PyMem_Calloc(ns, 1);
    views = PyMem_Calloc(ns, sizeof(Py_buffer));
    bases = PyMem_Calloc(ns, sizeof(int64_t));
    if (first == NULL || needed == NULL || views == NULL || bases == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    int64_t total = starts[nshards];
    const char *ip = iv.buf;
    for (Py_ssize_t i = 0; i < n; i++) {
        int64_t w = ch_ld64(ip + 8 * i), s;
        if (w < 0 || ch_mul_overflow(w, seq_len, &s) || s > total - seq_len - 1) {
            PyErr_Format(PyExc_IndexError, "window %lld is out of range: the stream holds %lld tokens, windows of %lld",
                         (long long)w, (long long)total, (long long)seq_len + 1);
            goto done;
        }
        first[i] = s;
        Py_ssize_t lo = shard_of(starts, nshards, s), hi = shard_of(starts, nshards, s + seq_len);
        for (Py_ssize_t k = lo; k <= hi; k++)
            needed[k] = 1;
    }
    PyObject *sources = a[3];
    for (Py_ssize_t k = 0; k < nshards; k++) {
        if (!needed[k] || starts[k + 1] == starts[k])
            continue;
        PyObject *item = ch_item_ref(sources, k, "sources"); /* a list or a tuple (ch_check_sources) */
        if (item == NULL)
            goto done;
        int taken = take_window_source(module, item, k, starts[k + 1] - starts[k], (int)itemsize, &views[k], &bases[k]);
        Py_DECREF(item);
        if (taken < 0)
            goto done;
    }
    int64_t *in = inv.buf, *lab = lv.buf;
    PyThreadState *released = values >= CH_RELEASE_GIL_BYTES / 8 ? PyEval_SaveThread() : NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        /* stream[first[i] .. first[i] + L] -> input_ids row (first L), labels row (last L) */
        for (int pass = 0; pass < 2; pass++) {
            int64_t *dst = (pass == 0 ? in : lab) + i * seq_len;
            int64_t pos = first[i] + pass, left = seq_len;
            Py_ssize_t k = shard_of(starts, nshards, pos);
            while (left > 0) {
                int64_t avail = starts[k + 1] - pos;
                if (avail <= 0) {
                    k++;
                    continue;
                }
                int64_t take = avail < left ? avail : left;
                widen(dst, views[k].buf, bases[k] + (pos - starts[k]), take, (int)itemsize);
                dst += take;
                pos += take;
                left -= take;
            }
        }
    }
    if (released != NULL)
        PyEval_RestoreThread(released);
    result = Py_NewRef(Py_None);
done:
    if (views != NULL) {
        for (Py_ssize_t k = 0; k < nshards; k++)
            ch_release(&views[k]);
    }
    PyMem_Free(views);
    PyMem_Free(bases);
    PyMem_Free(first);
    PyMem_Free(needed);
    PyMem_Free(starts);
    ch_release(&iv);
    ch_release(&sv);
    ch_release(&inv);
    ch_release(&lv);
    return result;
}

/* Next-fit packing of documents with token offsets off[0..m] into sequences of at most L
 * tokens: a document that fits what is left of the current sequence joins it; one that
 * does not closes it (the rest is padding) and starts the next; a document longer than L
 * fills whole sequences of L and its remainder starts the next one. Every sequence is a
 * contiguous range of the tokens, so the plan is their boundaries: the first `cap` of them
 * are written to `out` (none when cap is 0). One pass, which also checks the offsets never
 * decrease: returns the number of sequences, or -1 with *bad set to the first document
 * whose end is before its start. */
static int64_t plan(const char *off, Py_ssize_t m, int64_t L, int64_t *out, int64_t cap, Py_ssize_t *bad)
{
    int64_t start = ch_ld64(off), fill = 0, count = 0;
    if (start < 0) {
        *bad = 0;
        return -1;
    }
    if (cap > 0)
        out[0] = start;
#define EMIT(value)                        \
    do {                                   \
        count++;                           \
        if (count < cap)                   \
            out[count] = (value);          \
    } while (0)
    int64_t doc = start;
    for (Py_ssize_t d = 0; d < m; d++) {
        int64_t next = ch_ld64(off + 8 * (d + 1)), len = next - doc;
        if (len < 0) {
            *bad = d;
            return -1;
        }
        if (len > 0) {
            if (len <= L - fill) {
                fill += len;
            } else {
                if (fill > 0)
                    EMIT(doc);
                start = doc;
                while (len > L) {
                    start += L;
                    len -= L;
                    EMIT(start);
                }
                fill = len;
            }
        }
        doc = next;
    }
    if (fill > 0)
        EMIT(start + fill);
#undef EMIT
    return count;
}

PyObject *ch_tokens_plan(PyObject *module, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    (void)module;
    static const char *const names[] = {"doc_offsets", "seq_len", "out", NULL};
    PyObject *a[3];
    if (ch_parse_args("tokens_plan", args, nargs, kwnames, names, 2, a) < 0)
        return NULL;
    Py_buffer dv = {0}, ov = {0};
    Py_ssize_t m = 0, nout = 0, bad = 0;
    int64_t seq_len;
    PyObject *result = NULL;
    if (ch_int_arg(a[1], 1, INT32_MAX, "seq_len", &seq_len) < 0)
        goto done;
    if (ch_int_buffer(a[0], &dv, 8, 0, 1, "doc_offsets", &m) < 0)
        goto done;
    if (m < 1) {
        PyErr_SetString(PyExc_ValueError, "doc_offsets must hold D + 1 entries for D documents");
        goto done;
    }
    m -= 1;
    if (a[2] != NULL && a[2] != Py_None && ch_int_buffer(a[2], &ov, 8, 1, 1, "out", &nout) < 0)
        goto done;
    PyThreadState *released = m >= 8192 ? PyEval_SaveThread() : NULL;
    int64_t count = plan(dv.buf, m, seq_len, ov.obj != NULL ? ov.buf : NULL, ov.obj != NULL ? nout : 0, &bad);
    if (released != NULL)
        PyEval_RestoreThread(released);
    if (count < 0) {
        PyErr_Format(PyExc_ValueError, "document offsets decrease at document %zd (or start below 0)", bad);
        goto done;
    }
    if (ov.obj != NULL && nout != count + 1) { /* out is then partly written: the caller's scratch, not data */
        PyErr_Format(PyExc_ValueError, "out holds %zd entries, the plan needs %lld", nout, (long long)count + 1);
        goto done;
    }
    result = PyLong_FromLongLong(count);
done:
    ch_release(&dv);
    ch_release(&ov);
    return result;
}

/* First index j in [lo, hi) with off[j] > pos (hi if none); off nondecreasing. */
static Py_ssize_t upper(const char *off, Py_ssize_t lo, Py_ssize_t hi, int64_t pos)
{
    while (lo < hi) {
        Py_ssize_t mid = lo + (hi - lo) / 2;
        if (ch_ld64(off + 8 * mid) <= pos)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

PyObject *ch_tokens_packed(PyObject *module, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    static const char *const names[] = {"indices", "offsets", "sources", "itemsize", "seq_len", "pad_id",
                                        "input_ids", "labels", "position_ids", "cu_seqlens", NULL};
    PyObject *a[10];
    if (ch_parse_args("tokens_packed", args, nargs, kwnames, names, 10, a) < 0)
        return NULL;
    Batch b;
    Held h = {0};
    Py_buffer inv = {0}, lv = {0}, pv = {0}, cv = {0};
    int64_t itemsize, seq_len, pad_id;
    Py_ssize_t count, ncu;
    int64_t *ranges = NULL; /* per index: a, b, first document boundary index, slot */
    PyObject *result = NULL;
    if (ch_batch_open(&b, a[0], a[1]) < 0)
        goto done;
    if (ch_int_arg(a[3], 2, 4, "itemsize", &itemsize) < 0 || ch_int_arg(a[4], 1, INT32_MAX, "seq_len", &seq_len) < 0 ||
        ch_int_arg(a[5], INT64_MIN, INT64_MAX, "pad_id", &pad_id) < 0)
        goto done;
    if (itemsize == 3) {
        PyErr_SetString(PyExc_ValueError, "itemsize must be 2 (uint16) or 4 (uint32)");
        goto done;
    }
    if (ch_check_sources(a[2], b.nshards, "sources") < 0)
        goto done;
    int64_t values; /* n x L, the size of each output */
    if (ch_mul_overflow((int64_t)b.n, seq_len, &values)) {
        PyErr_Format(PyExc_ValueError, "%zd rows of %lld tokens do not fit an int64 count", b.n, (long long)seq_len);
        goto done;
    }
    Py_buffer *outs[3] = {&inv, &lv, &pv};
    const char *out_names[3] = {"input_ids", "labels", "position_ids"};
    for (int k = 0; k < 3; k++) {
        if (ch_int_buffer(a[6 + k], outs[k], 8, 1, 1, out_names[k], &count) < 0)
            goto done;
        if (count != values) {
            PyErr_Format(PyExc_ValueError, "%s holds %zd values, needs %zd x %lld", out_names[k], count, b.n,
                         (long long)seq_len);
            goto done;
        }
    }
    if (ch_int_buffer(a[9], &cv, 4, 1, 1, "cu_seqlens", &ncu) < 0)
        goto done;
    if (values > INT32_MAX || ncu < values + 1) {
        PyErr_Format(PyExc_ValueError, "cu_seqlens holds %zd entries, needs %zd x %lld + 1 (at most 2**31)", ncu, b.n,
                     (long long)seq_len);
        goto done;
    }
    if (ch_batch_resolve(&b) < 0)
        goto done;
    if (ch_held_init(&h, b.nslots, 3, 0) < 0)
        goto done;
    for (Py_ssize_t j = 0; j < b.ntouched; j++) {
        if (ch_held_take(module, &h, &b, b.order[j], a[2], "sources") < 0)
            goto done;
    }
    ranges = PyMem_Malloc((size_t)(b.n > 0 ? b.n : 1) * 3 * sizeof(int64_t));
    if (ranges == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < b.n; i++) { /* check every range before writing anything */
        int32_t k = b.slot[i];
        Py_buffer *tv = ch_held_view(&h, k, 0), *dv = ch_held_view(&h, k, 1), *plv = ch_held_view(&h, k, 2);
        int64_t r = b.row[i], ntok = tv->len / itemsize, ndoc = dv->len / 8;
        if (plv->len / 8 != b.rows[k] + 1) {
            ch_raise_corrupt(module, b.shard[k], -1, "its plan holds %zd boundaries for %lld sequences", plv->len / 8,
                             (long long)b.rows[k]);
            goto done;
        }
        int64_t lo = ch_ld64((const char *)plv->buf + 8 * r), hi = ch_ld64((const char *)plv->buf + 8 * (r + 1));
        if (lo < 0 || hi < lo || hi > ntok || hi - lo > seq_len || ndoc < 1) {
            ch_raise_corrupt(module, b.shard[k], r, "sequence [%lld, %lld) does not fit %lld tokens of L=%lld",
                             (long long)lo, (long long)hi, (long long)ntok, (long long)seq_len);
            goto done;
        }
        ranges[3 * i] = lo;
        ranges[3 * i + 1] = hi;
        ranges[3 * i + 2] = upper(dv->buf, 0, ndoc, lo); /* first document boundary after lo */
    }
    int64_t *in = inv.buf, *lab = lv.buf, *posid = pv.buf;
    int32_t *cu = cv.buf;
    Py_ssize_t nc = 0;
    PyThreadState *released = values >= CH_RELEASE_GIL_BYTES / 24 ? PyEval_SaveThread() : NULL;
    cu[nc++] = 0;
    for (Py_ssize_t i = 0; i < b.n; i++) {
        int32_t k = b.slot[i];
        Py_buffer *tv = ch_held_view(&h, k, 0), *dv = ch_held_view(&h, k, 1);
        const char *off = dv->buf;
        Py_ssize_t ndoc = dv->len / 8;
        int64_t lo = ranges[3 * i], hi = ranges[3 * i + 1], row0 = (int64_t)i * seq_len;
        int64_t *rin = in + row0, *rlab = lab + row0, *rpos = posid + row0;
        /* The sequence is the contiguous token range [lo, hi): input_ids is that range, labels the range
         * one token on, each a single loop; then per piece (document part) its position ids, the -100 of
         * its last label and its cu_seqlens entry. */
        if (hi > lo) {
            widen(rin, tv->buf, lo, hi - lo, (int)itemsize);
            widen(rlab, tv->buf, lo + 1, hi - lo - 1, (int)itemsize);
        }
        int64_t p = lo;
        for (Py_ssize_t d = ranges[3 * i + 2]; p < hi; d++) {
            int64_t q = d < ndoc ? ch_ld64(off + 8 * d) : hi;
            if (q <= p) /* an empty document, or offsets that went back: never behind p */
                continue;
            if (q > hi)
                q = hi;
            iota(rpos + (p - lo), 0, q - p);
            rlab[q - lo - 1] = -100;
            cu[nc++] = (int32_t)(row0 + (q - lo));
            p = q;
        }
        int64_t used = hi - lo;
        if (used < seq_len) { /* padding: one more segment */
            fill(rin + used, pad_id, seq_len - used);
            fill(rlab + used, -100, seq_len - used);
            iota(rpos + used, 0, seq_len - used);
            cu[nc++] = (int32_t)(row0 + seq_len);
        }
    }
    if (released != NULL)
        PyEval_RestoreThread(released);
    result = PyLong_FromSsize_t(nc);
done:
    PyMem_Free(ranges);
    ch_held_close(&h);
    ch_release(&inv);
    ch_release(&lv);
    ch_release(&pv);
    ch_release(&cv);
    ch_batch_close(&b);
    return result;
}
