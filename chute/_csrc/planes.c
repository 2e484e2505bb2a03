/* planes: one image's crop, from interleaved RGB (HWC, as decoders give it) to planes (CHW, as
 * models take it), optionally mirrored. numpy's copy of a transposed view moves one byte at a
 * time (about 60 us for 224 x 224 here); with SSSE3, 16 pixels take three loads, nine shuffles
 * and three stores (about 11 us). */
#include "kernels.h"
#include "native.h"

#ifdef CH_X86_SIMD
#include <tmmintrin.h>
#define CH_SSSE3 1
#endif

/* Row y of the crop: w pixels from s (3 bytes each) into d0, d1, d2 (w bytes each), mirrored with flip. */
static void row_scalar(const uint8_t *s, int64_t from, int64_t w, uint8_t *d0, uint8_t *d1, uint8_t *d2, int flip)
{
    for (int64_t x = from; x < w; x++) {
        int64_t at = flip ? w - 1 - x : x;
        d0[at] = s[3 * x];
        d1[at] = s[3 * x + 1];
        d2[at] = s[3 * x + 2];
    }
}

static void planes_scalar(const uint8_t *src, int64_t width, int64_t x0, int64_t y0, int64_t h, int64_t w,
                          uint8_t *dst, int flip)
{
    int64_t plane = h * w;
    for (int64_t y = 0; y < h; y++) {
        uint8_t *d0 = dst + y * w;
        row_scalar(src + ((y0 + y) * width + x0) * 3, 0, w, d0, d0 + plane, d0 + 2 * plane, flip);
    }
}

#ifdef CH_SSSE3
__attribute__((target("ssse3"))) static void planes_ssse3(const uint8_t *src, int64_t width, int64_t x0, int64_t y0,
                                                           int64_t h, int64_t w, uint8_t *dst, int flip)
{
    /* 16 pixels are 48 bytes in a, b, c: channel k's 16 bytes are 5 or 6 from each, put in place by one
     * shuffle of each (-1: zero) and or-ed together. */
    const __m128i r0 = _mm_setr_epi8(0, 3, 6, 9, 12, 15, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1);
    const __m128i r1 = _mm_setr_epi8(-1, -1, -1, -1, -1, -1, 2, 5, 8, 11, 14, -1, -1, -1, -1, -1);
    const __m128i r2 = _mm_setr_epi8(-1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, 1, 4, 7, 10, 13);
    const __m128i g0 = _mm_setr_epi8(1, 4, 7, 10, 13, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1);
    const __m128i g1 = _mm_setr_epi8(-1, -1, -1, -1, -1, 0, 3, 6, 9, 12, 15, -1, -1, -1, -1, -1);
    const __m128i g2 = _mm_setr_epi8(-1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, 2, 5, 8, 11, 14);
    const __m128i b0 = _mm_setr_epi8(2, 5, 8, 11, 14, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1);
    const __m128i b1 = _mm_setr_epi8(-1, -1, -1, -1, -1, 1, 4, 7, 10, 13, -1, -1, -1, -1, -1, -1);
    const __m128i b2 = _mm_setr_epi8(-1, -1, -1, -1, -1, -1, -1, -1, -1, -1, 0, 3, 6, 9, 12, 15);
    const __m128i rev = _mm_setr_epi8(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
    int64_t plane = h * w;
    for (int64_t y = 0; y < h; y++) {
        const uint8_t *s = src + ((y0 + y) * width + x0) * 3;
        uint8_t *d0 = dst + y * w, *d1 = d0 + plane, *d2 = d1 + plane;
        int64_t x = 0;
        for (; x + 16 <= w; x += 16) {
            __m128i a = _mm_loadu_si128((const __m128i *)(s + 3 * x));
            __m128i b = _mm_loadu_si128((const __m128i *)(s + 3 * x + 16));
            __m128i c = _mm_loadu_si128((const __m128i *)(s + 3 * x + 32));
            __m128i red = _mm_or_si128(_mm_or_si128(_mm_shuffle_epi8(a, r0), _mm_shuffle_epi8(b, r1)), _mm_shuffle_epi8(c, r2));
            __m128i green = _mm_or_si128(_mm_or_si128(_mm_shuffle_epi8(a, g0), _mm_shuffle_epi8(b, g1)), _mm_shuffle_epi8(c, g2));
            __m128i blue = _mm_or_si128(_mm_or_si128(_mm_shuffle_epi8(a, b0), _mm_shuffle_epi8(b, b1)), _mm_shuffle_epi8(c, b2));
            int64_t at = x;
            if (flip) {
                at = w - 16 - x;
                red = _mm_shuffle_epi8(red, rev);
                green = _mm_shuffle_epi8(green, rev);
                blue = _mm_shuffle_epi8(blue, rev);
            }
            _mm_storeu_si128((__m128i *)(d0 + at), red);
            _mm_storeu_si128((__m128i *)(d1 + at), green);
            _mm_storeu_si128((__m128i *)(d2 + at), blue);
        }
        row_scalar(s, x, w, d0, d1, d2, flip);
    }
}
#endif

void ch_planes_run(const uint8_t *src, int64_t width, int64_t x0, int64_t y0, int64_t h, int64_t w, uint8_t *dst, int flip)
{
#ifdef CH_SSSE3
    if (__builtin_cpu_supports("ssse3")) {
        planes_ssse3(src, width, x0, y0, h, w, dst, flip);
        return;
    }
#endif
    planes_scalar(src, width, x0, y0, h, w, dst, flip);
}

#ifndef CH_KERNELS_ONLY /* chute._jpeg compiles the kernel alone (chute/_jpegsrc/kernels.c) */
PyObject *ch_planes(PyObject *module, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    (void)module;
    static const char *const names[] = {"image", "height", "width", "x0", "y0", "out", "out_height", "out_width", "flip", NULL};
    PyObject *a[9];
    if (ch_parse_args("planes", args, nargs, kwnames, names, 8, a) < 0)
        return NULL;
    int64_t height, width, x0, y0, h, w;
    const int64_t most = INT64_C(1) << 28; /* pixels a side: far above any image, keeps the products in range */
    if (ch_int_arg(a[1], 0, most, "height", &height) < 0 || ch_int_arg(a[2], 0, most, "width", &width) < 0 ||
        ch_int_arg(a[3], 0, most, "x0", &x0) < 0 || ch_int_arg(a[4], 0, most, "y0", &y0) < 0 ||
        ch_int_arg(a[6], 0, most, "out_height", &h) < 0 || ch_int_arg(a[7], 0, most, "out_width", &w) < 0)
        return NULL;
    int flip = 0;
    if (a[8] != NULL && (flip = PyObject_IsTrue(a[8])) < 0)
        return NULL;
    if (x0 + w > width || y0 + h > height) {
        PyErr_Format(PyExc_ValueError, "the crop x %lld..%lld, y %lld..%lld is outside the %lld x %lld image",
                     (long long)x0, (long long)(x0 + w), (long long)y0, (long long)(y0 + h), (long long)width, (long long)height);
        return NULL;
    }
    Py_buffer image, out;
    if (ch_byte_buffer(a[0], &image, 0, "image") < 0)
        return NULL;
    if (ch_byte_buffer(a[5], &out, 1, "out") < 0) {
        ch_release(&image);
        return NULL;
    }
    if (image.len != height * width * 3 || out.len != 3 * h * w) {
        PyErr_Format(PyExc_ValueError,
                     "image holds %zd bytes and out %zd: an RGB image of %lld x %lld needs %lld, a crop of %lld x %lld %lld",
                     image.len, out.len, (long long)width, (long long)height, (long long)(height * width * 3), (long long)w,
                     (long long)h, (long long)(3 * h * w));
        ch_release(&image);
        ch_release(&out);
        return NULL;
    }
    if (out.len >= CH_RELEASE_GIL_BYTES) {
        Py_BEGIN_ALLOW_THREADS
        ch_planes_run(image.buf, width, x0, y0, h, w, out.buf, flip);
        Py_END_ALLOW_THREADS
    } else {
        ch_planes_run(image.buf, width, x0, y0, h, w, out.buf, flip);
    }
    ch_release(&image);
    ch_release(&out);
    return Py_NewRef(Py_None);
}
#endif /* CH_KERNELS_ONLY */
