/* The image kernels that chute._jpeg's batch decode shares with chute._native (chute/_jpegsrc/kernels.c
 * compiles planes.c and resample.c again with CH_KERNELS_ONLY: the kernels without their Python entry
 * points). Neither checks its arguments: the caller has (ch_planes and ch_resample for chute._native,
 * decode_batch for chute._jpeg), and neither touches Python objects, so both run without the GIL. */
#ifndef CHUTE_KERNELS_H
#define CHUTE_KERNELS_H

#include <stdint.h>

/* The h x w crop at (x0, y0) of an interleaved RGB image `width` pixels wide, written as three planes of
 * h x w bytes into dst, mirrored left-right with flip. */
void ch_planes_run(const uint8_t *src, int64_t width, int64_t x0, int64_t y0, int64_t h, int64_t w, uint8_t *dst, int flip);

/* One resample (resample.c): box (inside the image, not empty) of the interleaved RGB image src of
 * height x width, to oh x ow, mirrored with flip, as planes into out: bytes, or through lut (3 x 256
 * values of lut_size bytes: float32 or float16 bits) when it is not NULL. */
typedef struct {
    const uint8_t *src;
    int64_t height, width;
    float box[4]; /* single precision, as Pillow takes it: the weights depend on it */
    int64_t oh, ow;
    int flip;
    void *out;
    const void *lut; /* NULL (uint8 output), or 3 x 256 values of lut_size bytes */
    int lut_size;
} ChResampleJob;

/* 0, or -1 out of memory. */
int ch_resample_run(const ChResampleJob *job);

#endif
