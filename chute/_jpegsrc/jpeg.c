/* chute._jpeg: decode one region of a JPEG (rows and columns), optionally scaled in the inverse DCT;
 * and a whole batch of them, cropped or resampled into the batch's block, in one call.
 *
 * libjpeg-turbo's partial decoding: jpeg_skip_scanlines() passes over the rows above the region
 * (entropy decoding only: no inverse DCT, upsampling or colour conversion), jpeg_crop_scanline()
 * limits the inverse DCT and colour conversion to the iMCU columns the region touches, and the
 * decode stops after the region's last row (nothing below it is read). The GIL is released for the
 * whole decode. Colours as simplejpeg's and Pillow's defaults: the accurate integer DCT and smooth
 * ("fancy") chroma upsampling. A libjpeg warning (corrupt or truncated data) is an error, as in
 * simplejpeg's strict mode: a silently grey-filled image is worse than a skipped one.
 *
 * headers() and decode_batch() do a batch's images in one call each, the GIL released once for all of
 * them (chute.images.Decode): a loader thread then hands the GIL over twice per batch, not three times
 * per image, and is never caught holding it between two images while the training loop waits for it.
 * decode_batch() writes each image into its slot with chute._native's crop and resample kernels
 * (kernels.c), the same code and arithmetic as the per-image path.
 *
 * Nothing from the file is trusted before it is checked: the pixel count its header claims against
 * max_pixels, and the region against the caller's buffer, before jpeg_start_decompress() allocates
 * libjpeg's buffers (a progressive JPEG's coefficients are those of the whole image).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <setjmp.h>
#include <stdio.h>
#include <string.h>

#include <jpeglib.h>

#include "../_csrc/kernels.h"

/* jpeg_skip_scanlines() and jpeg_crop_scanline() came with libjpeg-turbo 1.5: without them the optional
 * extension is not built, and chute.images decodes whole images. */
#if !defined(LIBJPEG_TURBO_VERSION_NUMBER) || LIBJPEG_TURBO_VERSION_NUMBER < 1005000
#error "chute._jpeg needs libjpeg-turbo 1.5 or later"
#endif

struct fail {
    struct jpeg_error_mgr mgr;
    jmp_buf jump;
    char message[JMSG_LENGTH_MAX];
};

static void on_error(j_common_ptr cinfo)
{
    struct fail *f = (struct fail *)cinfo->err;
    (*cinfo->err->format_message)(cinfo, f->message);
    longjmp(f->jump, 1);
}

static void on_message(j_common_ptr cinfo, int level)
{
    if (level < 0) on_error(cinfo); /* a warning: corrupt data */
}

PyDoc_STRVAR(decode_region_doc,
"decode_region(data, out, scale, x0, y0, x1, y1, max_pixels=0) -> (left, top, width, height)\n\n"
"Decode the JPEG ``data`` at 1/``scale`` (1, 2, 4 or 8) as RGB, only rows ``[y0, y1)`` and at least\n"
"columns ``[x0, x1)`` of the scaled image, into ``out`` (a writable buffer of bytes), as rows of\n"
"``width`` pixels. Returns where the decoded block lies in the scaled image: columns are widened\n"
"to whole iMCUs on the left, so ``left <= x0`` and ``left + width == x1``; ``top == y0``.\n"
"ValueError for data libjpeg cannot decode (its message), a region outside the image, or an image\n"
"whose header claims more than ``max_pixels`` pixels (0: no limit), refused before libjpeg allocates.");

struct region {
    const unsigned char *data;
    unsigned long size;
    unsigned char *out;
    Py_ssize_t capacity;
    unsigned int scale, x0, y0, x1, y1;
    unsigned long long max_pixels; /* 0: no limit */
    JDIMENSION left, width;        /* out: the decoded block's columns */
};

/* The decode, without the GIL. Returns NULL or what went wrong (libjpeg's message lives in *fail).
 * Everything that must survive a longjmp out of libjpeg is written through r or fail, not kept in
 * locals of this frame. */
static const char *run(struct jpeg_decompress_struct *cinfo, struct fail *fail, struct region *r)
{
    if (setjmp(fail->jump)) return fail->message[0] ? fail->message : "libjpeg failed without a message";
    jpeg_create_decompress(cinfo); /* inside: it fails through error_exit, e.g. on a library of another version */
    jpeg_mem_src(cinfo, r->data, r->size);
    jpeg_read_header(cinfo, TRUE);
    cinfo->out_color_space = JCS_RGB;
    cinfo->dct_method = JDCT_ISLOW;
    cinfo->do_fancy_upsampling = TRUE;
    cinfo->scale_num = 1;
    cinfo->scale_denom = r->scale;
    /* The header's claims, checked before jpeg_start_decompress() allocates anything of their size. */
    if (r->max_pixels > 0 && (unsigned long long)cinfo->image_width * cinfo->image_height > r->max_pixels) {
        snprintf(fail->message, sizeof(fail->message), "the image's header claims %u x %u pixels, more than max_pixels = %llu",
                 (unsigned int)cinfo->image_width, (unsigned int)cinfo->image_height, r->max_pixels);
        return fail->message;
    }
    jpeg_calc_output_dimensions(cinfo);
    if (r->x0 >= r->x1 || r->y0 >= r->y1 || r->x1 > cinfo->output_width || r->y1 > cinfo->output_height)
        return "the region is empty or outside the scaled image";
    if ((Py_ssize_t)(r->x1 - r->x0) * 3 * (Py_ssize_t)(r->y1 - r->y0) > r->capacity)
        return "the output buffer is too small for the region";
    jpeg_start_decompress(cinfo);
    r->left = r->x0;
    r->width = r->x1 - r->x0;
    if (r->x0 > 0 || r->width < cinfo->output_width) jpeg_crop_scanline(cinfo, &r->left, &r->width);
    Py_ssize_t row_bytes = (Py_ssize_t)r->width * 3;
    if (row_bytes * (Py_ssize_t)(r->y1 - r->y0) > r->capacity) return "the output buffer is too small for the region";
    if (r->y0 > 0) jpeg_skip_scanlines(cinfo, r->y0);
    for (unsigned char *row = r->out; cinfo->output_scanline < r->y1; row += row_bytes) {
        JSAMPROW rows[1] = {row};
        if (jpeg_read_scanlines(cinfo, rows, 1) != 1) return "the JPEG data ended before the region's last row";
    }
    return NULL;
}

static PyObject *decode_region(PyObject *self, PyObject *args)
{
    (void)self;
    Py_buffer data, out;
    struct region r;
    int scale;
    memset(&r, 0, sizeof(r));
    if (!PyArg_ParseTuple(args, "y*w*iIIII|K", &data, &out, &scale, &r.x0, &r.y0, &r.x1, &r.y1, &r.max_pixels))
        return NULL;
    if (scale != 1 && scale != 2 && scale != 4 && scale != 8) {
        PyBuffer_Release(&data);
        PyBuffer_Release(&out);
        return PyErr_Format(PyExc_ValueError, "scale must be 1, 2, 4 or 8, got %d", scale);
    }
    r.data = (const unsigned char *)data.buf;
    r.size = (unsigned long)data.len;
    r.out = (unsigned char *)out.buf;
    r.capacity = out.len;
    r.scale = (unsigned int)scale;

    struct jpeg_decompress_struct cinfo;
    struct fail fail;
    const char *problem;
    memset(&cinfo, 0, sizeof(cinfo));
    fail.message[0] = '\0';
    cinfo.err = jpeg_std_error(&fail.mgr);
    fail.mgr.error_exit = on_error;
    fail.mgr.emit_message = on_message;
    Py_BEGIN_ALLOW_THREADS
    problem = run(&cinfo, &fail, &r);
    jpeg_destroy_decompress(&cinfo); /* frees what it allocated; nothing if the create itself failed */
    Py_END_ALLOW_THREADS

    PyBuffer_Release(&data);
    PyBuffer_Release(&out);
    if (problem != NULL) {
        PyErr_SetString(PyExc_ValueError, problem);
        return NULL;
    }
    return Py_BuildValue("(IIII)", (unsigned int)r.left, r.y0, (unsigned int)r.width, r.y1 - r.y0);
}

/* ------------------------------------------------------------------ batches */

/* The buffers of the items of a sequence, taken with the GIL held; ok[j] 0 where item j has none (its
 * error cleared: the caller's per-image path reports it). Released by release_all(). NULL: no memory. */
static Py_buffer *buffers_of(PyObject *seq, Py_ssize_t n, char *ok)
{
    Py_buffer *views = PyMem_Calloc((size_t)(n > 0 ? n : 1), sizeof(Py_buffer));
    if (views == NULL) return NULL;
    for (Py_ssize_t j = 0; j < n; j++) {
        ok[j] = PyObject_GetBuffer(PySequence_Fast_GET_ITEM(seq, j), &views[j], PyBUF_SIMPLE) == 0;
        if (!ok[j]) PyErr_Clear();
    }
    return views;
}

static void release_all(Py_buffer *views, const char *ok, Py_ssize_t n)
{
    for (Py_ssize_t j = 0; j < n; j++)
        if (ok[j]) PyBuffer_Release(&views[j]);
    PyMem_Free(views);
}

/* A writable, C-contiguous buffer of exactly `bytes` bytes (or at least, with at_least). -1: error set. */
static int writable(PyObject *obj, Py_buffer *view, Py_ssize_t bytes, int at_least, const char *what)
{
    if (PyObject_GetBuffer(obj, view, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0) return -1;
    if (at_least ? view->len < bytes : view->len != bytes) {
        PyErr_Format(PyExc_ValueError, "%s holds %zd bytes, %s%zd expected", what, view->len, at_least ? "at least " : "", bytes);
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

/* One header: 1 and (height, width) for a JPEG that libjpeg turns into RGB as simplejpeg does (grey,
 * YCbCr, RGB); 0 for anything else (not a JPEG, CMYK or YCCK, an error or a warning). */
static int read_header(const unsigned char *data, Py_ssize_t size, int64_t *height, int64_t *width)
{
    if (size < 3 || data[0] != 0xFF || data[1] != 0xD8 || data[2] != 0xFF) return 0;
    struct jpeg_decompress_struct cinfo;
    struct fail fail;
    volatile int ok = 0;
    memset(&cinfo, 0, sizeof(cinfo));
    fail.message[0] = '\0';
    cinfo.err = jpeg_std_error(&fail.mgr);
    fail.mgr.error_exit = on_error;
    fail.mgr.emit_message = on_message;
    if (!setjmp(fail.jump)) {
        jpeg_create_decompress(&cinfo);
        jpeg_mem_src(&cinfo, data, (unsigned long)size);
        jpeg_read_header(&cinfo, TRUE);
        J_COLOR_SPACE space = cinfo.jpeg_color_space;
        if (space == JCS_GRAYSCALE || space == JCS_YCbCr || space == JCS_RGB) {
            *height = (int64_t)cinfo.image_height;
            *width = (int64_t)cinfo.image_width;
            ok = 1;
        }
    }
    jpeg_destroy_decompress(&cinfo);
    return ok;
}

PyDoc_STRVAR(headers_doc,
"headers(images, out) -> None\n\n"
"The headers of a batch of encoded images (a sequence of buffers) in one call, the GIL released once:\n"
"``out`` (int64 ``[len(images), 3]``, C-contiguous) gets ``(height, width, 1)`` per JPEG that\n"
"decode_batch() decodes (grey, YCbCr or RGB), ``(0, 0, 0)`` for any other image (not a JPEG, CMYK or\n"
"YCCK, a header libjpeg cannot read or warns about): the caller reads those its own way. Nothing of an\n"
"image's size is allocated; the caller checks the sizes against its pixel limit.");

static PyObject *headers(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *images, *out_obj;
    if (!PyArg_ParseTuple(args, "OO", &images, &out_obj)) return NULL;
    PyObject *seq = PySequence_Fast(images, "images must be a sequence of buffers");
    if (seq == NULL) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    Py_buffer out;
    if (writable(out_obj, &out, n * 3 * (Py_ssize_t)sizeof(int64_t), 0, "out") < 0) {
        Py_DECREF(seq);
        return NULL;
    }
    char *ok = PyMem_Calloc((size_t)(n > 0 ? n : 1), 1);
    Py_buffer *views = ok == NULL ? NULL : buffers_of(seq, n, ok);
    if (views == NULL) {
        PyMem_Free(ok);
        PyBuffer_Release(&out);
        Py_DECREF(seq);
        return PyErr_NoMemory();
    }
    int64_t *found = (int64_t *)out.buf;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t j = 0; j < n; j++) {
        int64_t *row = found + 3 * j;
        row[0] = row[1] = 0;
        row[2] = ok[j] && read_header(views[j].buf, views[j].len, &row[0], &row[1]);
        if (!row[2]) row[0] = row[1] = 0;
    }
    Py_END_ALLOW_THREADS
    release_all(views, ok, n);
    PyMem_Free(ok);
    PyBuffer_Release(&out);
    Py_DECREF(seq);
    Py_RETURN_NONE;
}

/* A job's columns (int64, JOB_FIELDS per image): whether to decode it, the DCT scale, the region
 * [x0, y0, x1, y1) of the scaled image, the mirror flag, and whether the box is whole pixels at the
 * source's scale (a copy, no resample). */
enum { J_DO, J_SCALE, J_X0, J_Y0, J_X1, J_Y1, J_FLIP, J_WHOLE, JOB_FIELDS };

struct batch {
    const int64_t *jobs;
    const double *boxes; /* per image: the box in the scaled image (x0, y0, x1, y1) */
    unsigned char *scratch;
    Py_ssize_t capacity;
    unsigned char *out;
    int64_t oh, ow, slot; /* the output's size and the bytes of one image's slot */
    const void *lut;
    int lut_size;
    unsigned char *planes; /* oh * ow * 3 bytes for a copy through the table */
    unsigned long long max_pixels;
};

/* Image j of the batch into its slot: NULL, or what went wrong (a static string, or libjpeg's message
 * copied into `message`, JMSG_LENGTH_MAX bytes: the error manager's copy dies with this frame). */
static const char *decode_one(const struct batch *b, Py_ssize_t j, const Py_buffer *data, char *message)
{
    const int64_t *job = b->jobs + JOB_FIELDS * j;
    const double *box = b->boxes + 4 * j;
    struct region r;
    memset(&r, 0, sizeof(r));
    r.data = data->buf;
    r.size = (unsigned long)data->len;
    r.out = b->scratch;
    r.capacity = b->capacity;
    r.scale = (unsigned int)job[J_SCALE];
    r.x0 = (unsigned int)job[J_X0];
    r.y0 = (unsigned int)job[J_Y0];
    r.x1 = (unsigned int)job[J_X1];
    r.y1 = (unsigned int)job[J_Y1];
    r.max_pixels = b->max_pixels;
    struct jpeg_decompress_struct cinfo;
    struct fail fail;
    memset(&cinfo, 0, sizeof(cinfo));
    fail.message[0] = '\0';
    cinfo.err = jpeg_std_error(&fail.mgr);
    fail.mgr.error_exit = on_error;
    fail.mgr.emit_message = on_message;
    const char *problem = run(&cinfo, &fail, &r);
    jpeg_destroy_decompress(&cinfo);
    if (problem != NULL) {
        snprintf(message, JMSG_LENGTH_MAX, "%s", problem);
        return message;
    }
    /* The decoded block: rows [y0, y1) and columns [left, left + width) of the scaled image. */
    int64_t height = (int64_t)(r.y1 - r.y0), width = (int64_t)r.width;
    double x0 = box[0] - (double)r.left, y0 = box[1] - (double)r.y0, x1 = box[2] - (double)r.left, y1 = box[3] - (double)r.y0;
    unsigned char *slot = b->out + j * b->slot;
    int flip = job[J_FLIP] != 0;
    if (job[J_WHOLE]) { /* whole pixels: the crop, as planes (as int() in Python: truncated) */
        if (!(x0 >= 0 && y0 >= 0 && x1 >= x0 && y1 >= y0 && x1 < 9e18 && y1 < 9e18)) return "the crop is outside the decoded pixels";
        int64_t cx = (int64_t)x0, cy = (int64_t)y0, w = (int64_t)x1 - cx, h = (int64_t)y1 - cy;
        if (h != b->oh || w != b->ow || cx + w > width || cy + h > height) return "the crop is outside the decoded pixels";
        if (b->lut == NULL) {
            ch_planes_run(r.out, width, cx, cy, h, w, slot, flip);
            return NULL;
        }
        ch_planes_run(r.out, width, cx, cy, h, w, b->planes, flip);
        int64_t plane = h * w;
        for (int c = 0; c < 3; c++) {
            const unsigned char *p = b->planes + c * plane;
            if (b->lut_size == 4) {
                const float *t = (const float *)b->lut + 256 * c;
                float *d = (float *)slot + c * plane;
                for (int64_t i = 0; i < plane; i++) d[i] = t[p[i]];
            } else {
                const uint16_t *t = (const uint16_t *)b->lut + 256 * c;
                uint16_t *d = (uint16_t *)slot + c * plane;
                for (int64_t i = 0; i < plane; i++) d[i] = t[p[i]];
            }
        }
        return NULL;
    }
    ChResampleJob rs;
    memset(&rs, 0, sizeof(rs));
    rs.src = r.out;
    rs.height = height;
    rs.width = width;
    rs.box[0] = (float)x0;
    rs.box[1] = (float)y0;
    rs.box[2] = (float)x1;
    rs.box[3] = (float)y1;
    /* ch_resample's checks, in the same precision */
    if (!(rs.box[0] >= 0 && rs.box[1] >= 0 && rs.box[2] <= (double)width && rs.box[3] <= (double)height &&
          rs.box[2] > rs.box[0] && rs.box[3] > rs.box[1]))
        return "the box is empty or outside the decoded pixels";
    rs.oh = b->oh;
    rs.ow = b->ow;
    rs.flip = flip;
    rs.out = slot;
    rs.lut = b->lut;
    rs.lut_size = b->lut == NULL ? 1 : b->lut_size;
    if (ch_resample_run(&rs) < 0) return "out of memory for the resample";
    return NULL;
}

PyDoc_STRVAR(decode_batch_doc,
"decode_batch(images, jobs, boxes, scratch, out, out_height, out_width, lut=None, max_pixels=0) -> list\n\n"
"Decode a batch of JPEGs and write each into its slot of ``out``, in one call, the GIL released once.\n"
"Per image ``j`` (``jobs``: int64 ``[n, 8]``): if ``jobs[j, 0]``, decode rows ``[y0, y1)`` and at least\n"
"columns ``[x0, x1)`` (``jobs[j, 2:6]``) at 1/``jobs[j, 1]`` (1, 2, 4 or 8) into ``scratch``, as\n"
"decode_region() does, then take the box ``boxes[j]`` (float64 ``[n, 4]``: x0, y0, x1, y1 in the\n"
"scaled image) mirrored if ``jobs[j, 6]``: copied as planes where ``jobs[j, 7]`` (whole pixels at the\n"
"output's size), else resampled (chute._native.resample's arithmetic), into ``out[j]`` (uint8\n"
"``[n, 3, out_height, out_width]``, or float32/float16 through ``lut``, 3 x 256 values, as\n"
"chute._native.resample takes it). Returns ``[(j, message), ...]`` for the images that failed\n"
"(libjpeg's message, a box outside the pixels, an image over ``max_pixels``): their slots hold\n"
"anything. ``scratch`` must hold each image's scaled size (ceil(h / s) * ceil(w / s) * 3).");

static PyObject *decode_batch(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *images, *jobs_obj, *boxes_obj, *scratch_obj, *out_obj, *lut_obj = Py_None;
    long long oh, ow;
    struct batch b;
    memset(&b, 0, sizeof(b));
    if (!PyArg_ParseTuple(args, "OOOOOLL|OK", &images, &jobs_obj, &boxes_obj, &scratch_obj, &out_obj, &oh, &ow, &lut_obj,
                          &b.max_pixels))
        return NULL;
    if (oh < 1 || ow < 1 || oh > (1 << 24) || ow > (1 << 24))
        return PyErr_Format(PyExc_ValueError, "the output size %lld x %lld is outside 1..2**24", oh, ow);
    PyObject *seq = PySequence_Fast(images, "images must be a sequence of buffers");
    if (seq == NULL) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    Py_buffer jobs = {0}, boxes = {0}, scratch = {0}, out = {0}, lut = {0};
    Py_buffer *views = NULL;
    char *ok = NULL;
    PyObject *result = NULL;
    const char **problems = NULL;
    b.oh = oh;
    b.ow = ow;
    b.lut_size = 1;
    if (lut_obj != Py_None) {
        if (PyObject_GetBuffer(lut_obj, &lut, PyBUF_C_CONTIGUOUS) < 0) goto done;
        if (lut.len != 3 * 256 * 4 && lut.len != 3 * 256 * 2) {
            PyErr_Format(PyExc_ValueError, "lut holds %zd bytes: 3 x 256 float32 (3072) or float16 (1536) values expected", lut.len);
            goto done;
        }
        b.lut = lut.buf;
        b.lut_size = (int)(lut.len / (3 * 256));
    }
    b.slot = 3 * oh * ow * b.lut_size;
    if (PyObject_GetBuffer(jobs_obj, &jobs, PyBUF_C_CONTIGUOUS) < 0 || PyObject_GetBuffer(boxes_obj, &boxes, PyBUF_C_CONTIGUOUS) < 0)
        goto done;
    if (jobs.len != n * JOB_FIELDS * (Py_ssize_t)sizeof(int64_t) || boxes.len != n * 4 * (Py_ssize_t)sizeof(double)) {
        PyErr_Format(PyExc_ValueError, "jobs holds %zd bytes and boxes %zd: %zd images need %zd and %zd", jobs.len, boxes.len, n,
                     n * JOB_FIELDS * (Py_ssize_t)sizeof(int64_t), n * 4 * (Py_ssize_t)sizeof(double));
        goto done;
    }
    if (n > 0 && b.slot > PY_SSIZE_T_MAX / n) {
        PyErr_Format(PyExc_ValueError, "%zd slots of %lld bytes do not fit in memory", n, (long long)b.slot);
        goto done;
    }
    if (writable(scratch_obj, &scratch, 1, 1, "scratch") < 0 || writable(out_obj, &out, n * b.slot, 0, "out") < 0) goto done;
    b.jobs = jobs.buf;
    b.boxes = boxes.buf;
    b.scratch = scratch.buf;
    b.capacity = scratch.len;
    b.out = out.buf;
    for (Py_ssize_t j = 0; j < n; j++) { /* checked before any decode: nothing below trusts a job */
        const int64_t *job = b.jobs + JOB_FIELDS * j;
        if (!job[J_DO]) continue;
        int64_t s = job[J_SCALE];
        if ((s != 1 && s != 2 && s != 4 && s != 8) || job[J_X0] < 0 || job[J_Y0] < 0 || job[J_X1] > UINT32_MAX ||
            job[J_Y1] > UINT32_MAX || job[J_X0] >= job[J_X1] || job[J_Y0] >= job[J_Y1]) {
            PyErr_Format(PyExc_ValueError, "job %zd: scale %lld, region %lld..%lld x %lld..%lld: a scale of 1, 2, 4 or 8 and a "
                         "non-empty region expected", j, (long long)s, (long long)job[J_X0], (long long)job[J_X1],
                         (long long)job[J_Y0], (long long)job[J_Y1]);
            goto done;
        }
    }
    ok = PyMem_Calloc((size_t)(n > 0 ? n : 1), 1);
    problems = PyMem_Calloc((size_t)(n > 0 ? n : 1), sizeof(const char *));
    char *messages = NULL; /* libjpeg's messages outlive each decode's error manager */
    if (ok == NULL || problems == NULL || (views = buffers_of(seq, n, ok)) == NULL ||
        (messages = PyMem_Calloc((size_t)(n > 0 ? n : 1), JMSG_LENGTH_MAX)) == NULL ||
        (b.lut != NULL && (b.planes = PyMem_Malloc((size_t)(3 * oh * ow))) == NULL)) {
        PyMem_Free(messages);
        PyErr_NoMemory();
        goto done;
    }
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t j = 0; j < n; j++) {
        if (!b.jobs[JOB_FIELDS * j + J_DO]) continue;
        char *message = messages + j * JMSG_LENGTH_MAX;
        const char *problem = ok[j] ? decode_one(&b, j, &views[j], message) : "the image is not a buffer";
        if (problem != NULL && problem != message) snprintf(message, JMSG_LENGTH_MAX, "%s", problem);
        if (problem != NULL) problems[j] = message;
    }
    Py_END_ALLOW_THREADS
    result = PyList_New(0);
    for (Py_ssize_t j = 0; result != NULL && j < n; j++) {
        if (problems[j] == NULL) continue;
        PyObject *item = Py_BuildValue("(ns)", j, problems[j]);
        if (item == NULL || PyList_Append(result, item) < 0) Py_CLEAR(result);
        Py_XDECREF(item);
    }
    PyMem_Free(messages);
done:
    if (views != NULL) release_all(views, ok, n);
    PyMem_Free(ok);
    PyMem_Free(problems);
    PyMem_Free(b.planes);
    if (jobs.obj != NULL) PyBuffer_Release(&jobs);
    if (boxes.obj != NULL) PyBuffer_Release(&boxes);
    if (scratch.obj != NULL) PyBuffer_Release(&scratch);
    if (out.obj != NULL) PyBuffer_Release(&out);
    if (lut.obj != NULL) PyBuffer_Release(&lut);
    Py_DECREF(seq);
    return result;
}

static PyMethodDef methods[] = {
    {"decode_region", decode_region, METH_VARARGS, decode_region_doc},
    {"headers", headers, METH_VARARGS, headers_doc},
    {"decode_batch", decode_batch, METH_VARARGS, decode_batch_doc},
    {NULL, NULL, 0, NULL},
};

/* No shared state: every call has its own decompressor, error manager and buffers, and the GIL is
 * released around the whole decode already. Free-threaded builds (3.13+) keep the GIL off. */
static PyModuleDef_Slot slots[] = {
#if PY_VERSION_HEX >= 0x030D0000
    {Py_mod_gil, Py_MOD_GIL_NOT_USED},
#endif
    {0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "chute._jpeg",
    .m_doc = "Partial JPEG decoding with libjpeg-turbo (built when its headers are present; see chute.images.codec).",
    .m_size = 0,
    .m_methods = methods,
    .m_slots = slots,
};

PyMODINIT_FUNC PyInit__jpeg(void)
{
    return PyModuleDef_Init(&module);
}
