/* The crop and resample kernels of chute._native (chute/_csrc/planes.c and resample.c), compiled into
 * chute._jpeg too, without their Python entry points: decode_batch (jpeg.c) writes each decoded image
 * into its slot of the batch with them, in the same call, without taking the GIL back between images. */
#define CH_KERNELS_ONLY 1
#include "../_csrc/planes.c"
#include "../_csrc/resample.c"
