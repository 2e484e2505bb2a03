/* resample: one image's box resampled to the output size (bilinear, antialiased when shrinking),
 * mirrored, laid out as planes and optionally normalised through a lookup table, in one call
 * without the GIL.
 *
 * The arithmetic is the published algorithm of Pillow's Image.resize(size, BILINEAR, box=...)
 * (separable triangle filter widened by the shrink factor, weights normalised per output pixel
 * and rounded to 22-bit fixed point, the box in single precision, a horizontal pass over the
 * rows the vertical pass needs, rounded to 8 bits, then the vertical pass): its values equal a
 * numpy implementation of that arithmetic and are within one level of Pillow 13's, which runs
 * the two passes in either order (tests/native/test_resample.py). Pillow itself would need the
 * image copied into its 4-byte pixels, a resize over 4 channels, a copy back out and the planes
 * and normalisation done apart: 1.6 ms per ImageNet-sized crop here against 0.5-1.0 ms.
 *
 * The normalisation is a table of 256 values per channel (float32 or float16 bits), so
 * ``(pixel / 255 - mean) / std`` costs one load per value and gives exactly what the float
 * arithmetic gave when the table was made. */
#include "kernels.h"
#include "native.h"

#include <math.h>
#include <stdlib.h>

#define RS_BITS 22 /* Pillow's PRECISION_BITS for 8-bit images: 32 - 8 - 2 */

typedef struct {
    int *bounds;  /* per output pixel: first input pixel, number of input pixels */
    int32_t *k;   /* per output pixel: ksize fixed-point weights */
    int ksize;
} Coeffs;

static double triangle(double x)
{
    if (x < 0.0)
        x = -x;
    return x < 1.0 ? 1.0 - x : 0.0;
}

/* The weights of out_size output pixels over [in0, in1) of in_size input pixels. 0, or -1 out of memory. */
static int coeffs_make(int in_size, float in0, float in1, int out_size, Coeffs *c)
{
    double scale = (double)(in1 - in0) / out_size; /* a float difference, as Pillow's (its box is float) */
    double filterscale = scale < 1.0 ? 1.0 : scale;
    double support = filterscale; /* the triangle's support is 1 */
    int ksize = (int)ceil(support) * 2 + 1;
    double *w = malloc(sizeof(double) * (size_t)ksize);
    c->bounds = malloc(sizeof(int) * 2 * (size_t)out_size);
    c->k = malloc(sizeof(int32_t) * (size_t)out_size * (size_t)ksize);
    c->ksize = ksize;
    if (w == NULL || c->bounds == NULL || c->k == NULL) {
        free(w);
        return -1;
    }
    for (int xx = 0; xx < out_size; xx++) {
        double center = in0 + (xx + 0.5) * scale, sum = 0.0, ss = 1.0 / filterscale;
        int xmin = (int)(center - support + 0.5), xmax = (int)(center + support + 0.5);
        if (xmin < 0)
            xmin = 0;
        if (xmax > in_size)
            xmax = in_size;
        xmax -= xmin;
        if (xmax < 0)
            xmax = 0;
        int x = 0;
        for (; x < xmax; x++) {
            w[x] = triangle((x + xmin - center + 0.5) * ss);
            sum += w[x];
        }
        int32_t *k = c->k + (size_t)xx * ksize;
        for (x = 0; x < xmax; x++) {
            double v = sum != 0.0 ? w[x] / sum : w[x];
            k[x] = (int32_t)(v < 0 ? -0.5 + v * (1 << RS_BITS) : 0.5 + v * (1 << RS_BITS));
        }
        for (; x < ksize; x++)
            k[x] = 0;
        c->bounds[2 * xx] = xmin;
        c->bounds[2 * xx + 1] = xmax;
    }
    free(w);
    return 0;
}

static void coeffs_free(Coeffs *c)
{
    free(c->bounds);
    free(c->k);
}

static inline uint8_t clip8(int32_t v)
{
    if (v >= (INT32_C(1) << (RS_BITS + 8)))
        return 255;
    return v <= 0 ? 0 : (uint8_t)(v >> RS_BITS);
}

typedef ChResampleJob Job; /* kernels.h */

/* Writes output row yy from its 3 * ow values (interleaved RGB): one plane per channel, mirrored
 * with flip (d walks backwards), through the lookup table when there is one. */
#define RS_STORE(type, value)                                                                              \
    do {                                                                                                   \
        type *d = (type *)job->out + base + (job->flip ? ow - 1 : 0);                                      \
        int64_t step = job->flip ? -1 : 1;                                                                 \
        for (int64_t x = 0; x < ow; x++, d += step)                                                        \
            *d = (value);                                                                                  \
    } while (0)

static void store_row(const Job *job, int64_t yy, const uint8_t *v)
{
    int64_t plane = job->oh * job->ow, ow = job->ow;
    for (int c = 0; c < 3; c++) {
        int64_t base = c * plane + yy * ow;
        const uint8_t *p = v + c;
        if (job->lut == NULL) {
            RS_STORE(uint8_t, p[3 * x]);
        } else if (job->lut_size == 4) {
            const float *t = (const float *)job->lut + 256 * c;
            RS_STORE(float, t[p[3 * x]]);
        } else {
            const uint16_t *t = (const uint16_t *)job->lut + 256 * c;
            RS_STORE(uint16_t, t[p[3 * x]]);
        }
    }
}

#if defined(CH_X86_SIMD) && !defined(__clang__) /* target_clones: gcc */
#define RS_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define RS_CLONES
#endif

/* One output row of the vertical pass: acc = half + sum of n rows of `line` bytes from `s` (a stride
 * of `line`) weighted by k, clipped into row. Integer sums: any order gives the same result, so the
 * loop runs along the row, where it vectorises (8 values an instruction with AVX2). */
RS_CLONES static void vertical_row(const uint8_t *s, int64_t line, const int32_t *k, int n, int32_t *acc, uint8_t *row)
{
    const int32_t half = INT32_C(1) << (RS_BITS - 1);
    for (int64_t i = 0; i < line; i++)
        acc[i] = half;
    for (int y = 0; y < n; y++) {
        const uint8_t *r = s + y * line;
        int32_t w = k[y];
        for (int64_t i = 0; i < line; i++)
            acc[i] += r[i] * w;
    }
    for (int64_t i = 0; i < line; i++)
        row[i] = clip8(acc[i]);
}

/* Row y of the horizontal pass: ow pixels of 3 channels from the source row s. */
static void horizontal_row(const uint8_t *s, const Coeffs *h, int64_t ow, uint8_t *d)
{
    const int32_t half = INT32_C(1) << (RS_BITS - 1);
    for (int64_t xx = 0; xx < ow; xx++) {
        const uint8_t *p = s + 3 * (int64_t)h->bounds[2 * xx];
        const int32_t *k = h->k + xx * h->ksize;
        int n = h->bounds[2 * xx + 1];
        int32_t s0 = half, s1 = half, s2 = half;
        for (int x = 0; x < n; x++, p += 3) {
            s0 += p[0] * k[x];
            s1 += p[1] * k[x];
            s2 += p[2] * k[x];
        }
        d[3 * xx] = clip8(s0);
        d[3 * xx + 1] = clip8(s1);
        d[3 * xx + 2] = clip8(s2);
    }
}

#ifdef CH_X86_SIMD
#include <immintrin.h>
#define RS_SIMD 1

/* The 3 bytes of the pixel at p as the low bytes of an int (the 4th byte: the next pixel's, whose lane
 * is ignored, or 0 at the end of the image); 0 past the end (its weight is 0: see horizontal_row_avx2). */
static inline int32_t pixel_bytes(const uint8_t *p, const uint8_t *end)
{
    int32_t v = 0;
    if (CH_UNLIKELY(p + 4 > end)) {
        if (p + 3 <= end)
            v = p[0] | p[1] << 8 | p[2] << 16;
    } else {
        memcpy(&v, p, 4);
    }
    return v;
}

/* Output pixels [from, ow) of horizontal_row with the three channels of a pixel in one vector: per tap
 * the pixel widened to 32 bits, times the weight, added; shifting and packing with saturation is clip8. */
__attribute__((target("sse4.1"))) static void horizontal_row_sse41(const uint8_t *s, const Coeffs *h, int64_t from,
                                                                   int64_t ow, uint8_t *d, const uint8_t *end)
{
    const __m128i half = _mm_set1_epi32(INT32_C(1) << (RS_BITS - 1));
    for (int64_t xx = from; xx < ow; xx++) {
        const uint8_t *p = s + 3 * (int64_t)h->bounds[2 * xx];
        const int32_t *k = h->k + xx * h->ksize;
        int n = h->bounds[2 * xx + 1];
        __m128i acc = half;
        for (int x = 0; x < n; x++, p += 3)
            acc = _mm_add_epi32(acc, _mm_mullo_epi32(_mm_cvtepu8_epi32(_mm_cvtsi32_si128(pixel_bytes(p, end))),
                                                     _mm_set1_epi32(k[x])));
        acc = _mm_srai_epi32(acc, RS_BITS);
        int32_t out = _mm_cvtsi128_si32(_mm_packus_epi16(_mm_packs_epi32(acc, acc), acc));
        memcpy(d + 3 * xx, &out, 3);
    }
}

/* Two output pixels at a time in the two halves of a 256-bit vector. Both run the larger number of
 * taps: the shorter one's weights are 0 past its own (Coeffs pads them), and its pixels there are
 * read within the image or as 0. */
__attribute__((target("avx2"))) static void horizontal_row_avx2(const uint8_t *s, const Coeffs *h, int64_t ow,
                                                                uint8_t *d, const uint8_t *end)
{
    const __m256i half = _mm256_set1_epi32(INT32_C(1) << (RS_BITS - 1));
    int64_t xx = 0;
    for (; xx + 2 <= ow; xx += 2) {
        const uint8_t *pa = s + 3 * (int64_t)h->bounds[2 * xx], *pb = s + 3 * (int64_t)h->bounds[2 * xx + 2];
        const int32_t *ka = h->k + xx * h->ksize, *kb = ka + h->ksize;
        int n = h->bounds[2 * xx + 1] > h->bounds[2 * xx + 3] ? h->bounds[2 * xx + 1] : h->bounds[2 * xx + 3];
        __m256i acc = half;
        for (int x = 0; x < n; x++, pa += 3, pb += 3) {
            __m256i v = _mm256_cvtepu8_epi32(_mm_set_epi32(0, 0, pixel_bytes(pb, end), pixel_bytes(pa, end)));
            __m256i w = _mm256_set_m128i(_mm_set1_epi32(kb[x]), _mm_set1_epi32(ka[x]));
            acc = _mm256_add_epi32(acc, _mm256_mullo_epi32(v, w));
        }
        acc = _mm256_srai_epi32(acc, RS_BITS);
        __m256i packed = _mm256_packus_epi16(_mm256_packs_epi32(acc, acc), acc);
        int32_t a = _mm_cvtsi128_si32(_mm256_castsi256_si128(packed));
        int32_t b = _mm_cvtsi128_si32(_mm256_extracti128_si256(packed, 1));
        memcpy(d + 3 * xx, &a, 3);
        memcpy(d + 3 * xx + 3, &b, 3);
    }
    horizontal_row_sse41(s, h, xx, ow, d, end);
}
#endif

/* 0, or -1 out of memory. As Pillow: the horizontal pass over the input rows the vertical pass reads,
 * then the vertical pass; a pass whose box is the whole side at the same size is skipped (it would
 * copy). The caller has checked the job (ch_resample, or chute._jpeg's batch decode): see kernels.h. */
int ch_resample_run(const Job *job)
{
    Coeffs h = {0}, v = {0};
    int32_t *acc = NULL;
    uint8_t *tmp = NULL, *row = NULL;
    int rc = -1;
    int64_t ow = job->ow, line = 3 * ow;
    int need_h = job->ow != job->width || job->box[0] != 0 || job->box[2] != (float)job->width;
    int need_v = job->oh != job->height || job->box[1] != 0 || job->box[3] != (float)job->height;
    if ((need_h && coeffs_make((int)job->width, job->box[0], job->box[2], (int)job->ow, &h) < 0) ||
        coeffs_make((int)job->height, job->box[1], job->box[3], (int)job->oh, &v) < 0)
        goto done;
    int64_t first = v.bounds[0], last = v.bounds[2 * (job->oh - 1)] + v.bounds[2 * (job->oh - 1) + 1];
    const uint8_t *rows_in = job->src + first * line; /* without a horizontal pass: the source rows (width == ow) */
    if (need_h) {
        tmp = malloc((size_t)(last - first > 0 ? last - first : 1) * (size_t)line);
        if (tmp == NULL)
            goto done;
        const uint8_t *end = job->src + job->height * job->width * 3;
        int simd = 0;
#ifdef RS_SIMD
        simd = __builtin_cpu_supports("avx2") ? 2 : __builtin_cpu_supports("sse4.1") ? 1 : 0;
#endif
        for (int64_t y = first; y < last; y++) {
            const uint8_t *s = job->src + y * job->width * 3;
            uint8_t *d = tmp + (y - first) * line;
#ifdef RS_SIMD
            if (simd == 2) {
                horizontal_row_avx2(s, &h, ow, d, end);
                continue;
            }
            if (simd == 1) {
                horizontal_row_sse41(s, &h, 0, ow, d, end);
                continue;
            }
#endif
            (void)end;
            (void)simd;
            horizontal_row(s, &h, ow, d);
        }
        rows_in = tmp;
    }
    acc = malloc(sizeof(int32_t) * (size_t)line);
    row = malloc((size_t)line);
    if (acc == NULL || row == NULL)
        goto done;
    for (int64_t yy = 0; yy < job->oh; yy++) {
        const uint8_t *s = rows_in + (v.bounds[2 * yy] - first) * line;
        if (need_v)
            vertical_row(s, line, v.k + yy * v.ksize, v.bounds[2 * yy + 1], acc, row);
        else
            memcpy(row, s, (size_t)line);
        store_row(job, yy, row);
    }
    rc = 0;
done:
    coeffs_free(&h);
    coeffs_free(&v);
    free(tmp);
    free(acc);
    free(row);
    return rc;
}

#ifndef CH_KERNELS_ONLY /* chute._jpeg compiles the kernel alone (chute/_jpegsrc/kernels.c) */
PyObject *ch_resample(PyObject *module, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    (void)module;
    static const char *const names[] = {"image", "height", "width", "box", "out", "out_height", "out_width", "flip", "lut", NULL};
    PyObject *a[9];
    if (ch_parse_args("resample", args, nargs, kwnames, names, 7, a) < 0)
        return NULL;
    Job job = {0};
    const int64_t most = INT64_C(1) << 24; /* pixels a side: keeps every product and int index in range */
    if (ch_int_arg(a[1], 1, most, "height", &job.height) < 0 || ch_int_arg(a[2], 1, most, "width", &job.width) < 0 ||
        ch_int_arg(a[5], 1, most, "out_height", &job.oh) < 0 || ch_int_arg(a[6], 1, most, "out_width", &job.ow) < 0)
        return NULL;
    PyObject *box = PySequence_Tuple(a[3]); /* private: nothing can change it while it is read */
    if (box == NULL) {
        if (PyErr_ExceptionMatches(PyExc_TypeError))
            PyErr_SetString(PyExc_TypeError, "box must be a sequence of 4 numbers (x0, y0, x1, y1)");
        return NULL;
    }
    if (PyTuple_GET_SIZE(box) != 4) {
        Py_DECREF(box);
        PyErr_SetString(PyExc_ValueError, "box must be 4 numbers (x0, y0, x1, y1)");
        return NULL;
    }
    for (int i = 0; i < 4; i++) {
        double value = PyFloat_AsDouble(PyTuple_GET_ITEM(box, i));
        job.box[i] = (float)value;
        if (value == -1.0 && PyErr_Occurred()) {
            Py_DECREF(box);
            return NULL;
        }
    }
    Py_DECREF(box);
    if (!(job.box[0] >= 0 && job.box[1] >= 0 && job.box[2] <= (double)job.width && job.box[3] <= (double)job.height &&
          job.box[2] > job.box[0] && job.box[3] > job.box[1])) {
        PyErr_Format(PyExc_ValueError, "the box (%R) is empty or outside the %lld x %lld image", a[3],
                     (long long)job.width, (long long)job.height);
        return NULL;
    }
    if (a[7] != NULL && (job.flip = PyObject_IsTrue(a[7])) < 0)
        return NULL;
    Py_buffer image = {0}, out = {0}, lut = {0};
    PyObject *result = NULL;
    if (ch_byte_buffer(a[0], &image, 0, "image") < 0 || ch_byte_buffer(a[4], &out, 1, "out") < 0)
        goto done;
    job.lut_size = 1;
    if (a[8] != NULL && a[8] != Py_None) {
        if (ch_byte_buffer(a[8], &lut, 0, "lut") < 0)
            goto done;
        if (lut.len != 3 * 256 * 4 && lut.len != 3 * 256 * 2) {
            PyErr_Format(PyExc_ValueError, "lut holds %zd bytes: 3 x 256 float32 (3072) or float16 (1536) values expected", lut.len);
            goto done;
        }
        job.lut = lut.buf;
        job.lut_size = (int)(lut.len / (3 * 256));
    }
    if (image.len != job.height * job.width * 3 || out.len != 3 * job.oh * job.ow * job.lut_size) {
        PyErr_Format(PyExc_ValueError,
                     "image holds %zd bytes and out %zd: an RGB image of %lld x %lld needs %lld, the output %lld",
                     image.len, out.len, (long long)job.width, (long long)job.height, (long long)(job.height * job.width * 3),
                     (long long)(3 * job.oh * job.ow * job.lut_size));
        goto done;
    }
    job.src = image.buf;
    job.out = out.buf;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = ch_resample_run(&job);
    Py_END_ALLOW_THREADS
    if (rc < 0) {
        PyErr_NoMemory();
        goto done;
    }
    result = Py_NewRef(Py_None);
done:
    ch_release(&image);
    ch_release(&out);
    ch_release(&lut);
    return result;
}
#endif /* CH_KERNELS_ONLY */
