/* chute._jpeg: decode one region of a JPEG (rows and columns), optionally scaled in the inverse DCT.
 *
 * libjpeg-turbo's partial decoding: jpeg_skip_scanlines() passes over the rows above the region
 * (entropy decoding only: no inverse DCT, upsampling or colour conversion), jpeg_crop_scanline()
 * limits the inverse DCT and colour conversion to the iMCU columns the region touches, and the
 * decode stops after the region's last row (nothing below it is read). The GIL is released for the
 * whole decode. Colours as simplejpeg's and Pillow's defaults: the accurate integer DCT and smooth
 * ("fancy") chroma upsampling. A libjpeg warning (corrupt or truncated data) is an error, as in
 * simplejpeg's strict mode: a silently grey-filled image is worse than a skipped one.
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

static PyMethodDef methods[] = {
    {"decode_region", decode_region, METH_VARARGS, decode_region_doc},
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
