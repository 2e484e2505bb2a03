/* chute._native: the module object, its exception classes and its method table. */
#include "native.h"

NativeState *ch_state(PyObject *module)
{
    return (NativeState *)PyModule_GetState(module);
}

#define CH_METHOD(name, doc) {#name, (PyCFunction)(void (*)(void))ch_##name, METH_FASTCALL | METH_KEYWORDS, doc}

static PyMethodDef methods[] = {
    CH_METHOD(gather,
              "gather(indices, offsets, columns) -> None\n\n"
              "Copy fixed-size rows: for each (sources, out, row_bytes) in columns, row i of out\n"
              "becomes global row indices[i]. sources[s] is None or shard s's rows back to back."),
    CH_METHOD(gather_binary,
              "gather_binary(indices, offsets, sources, item_size=1) -> (offsets, data)\n\n"
              "Gather rows of a large_binary / large_string / large_list column; sources[s] is\n"
              "None or (value_offsets int64, data). Returns int64 offsets (in items) and the values."),
    CH_METHOD(gather_map,
              "gather_map(indices, offsets, sources, value_size=8) -> (entry_offsets, key_offsets,\n"
              "key_data, value_offsets, value_data)\n\n"
              "Gather rows of a map<large_string, V> column; sources[s] is None or (entry_offsets\n"
              "int32, key_offsets int64, key_data, value_offsets int64 or None, value_data)."),
    CH_METHOD(join_json,
              "join_json(offsets, data) -> bytes\n\n"
              "b'[' + b','.join(rows) + b']' of the rows given by int64 offsets into data."),
    CH_METHOD(take_objects,
              "take_objects(indices, offsets, sources, kind) -> list\n\n"
              "The rows of a string/binary column as str (kind='str') or bytes (kind='bytes')."),
    CH_METHOD(take_dicts,
              "take_dicts(indices, offsets, sources, kind) -> list[dict]\n\n"
              "One dict per row of a map<large_string, V> column, keys in stored order; values of\n"
              "kind 'str', 'bytes', 'int64' or 'float64'."),
    CH_METHOD(dicts_from_values,
              "dicts_from_values(entry_offsets, key_offsets, key_data, values) -> list[dict]\n\n"
              "One dict per row from gather_map's entry structure and one value object per entry."),
    CH_METHOD(feistel,
              "feistel(n, half, round_keys, out) -> None\n\n"
              "Fill the int64 buffer out with chute.order's keyed Feistel permutation of range(n)."),
    CH_METHOD(group_by_shard,
              "group_by_shard(rows, width, offsets, out) -> None\n\n"
              "Each row of width int64 values of rows (C-contiguous), stably ordered by shard, into out (as many\n"
              "int64): a value's shard is numpy.searchsorted(offsets, value, side='right') (offsets: int64, S + 1).\n"
              "The same as rows[argsort(searchsorted(offsets, rows, 'right'), kind='stable')] row by row."),
    CH_METHOD(thread_class,
              "thread_class(policy, slice_ns) -> bool\n\n"
              "Put the calling thread (Linux) in the fair class policy (0: SCHED_OTHER, 3: SCHED_BATCH) with a\n"
              "time slice of slice_ns (0: the kernel's default; honoured from Linux 6.12), keeping its nice value.\n"
              "False where that cannot be done (another platform, a sandbox, a thread that may not leave its class)."),
    CH_METHOD(planes,
              "planes(image, height, width, x0, y0, out, out_height, out_width, flip=False) -> None\n\n"
              "Write the out_height x out_width crop at (x0, y0) of an RGB image (uint8 [height, width, 3],\n"
              "C-contiguous) into out as planes (uint8 [3, out_height, out_width]), mirrored left-right with flip."),
    CH_METHOD(resample,
              "resample(image, height, width, box, out, out_height, out_width, flip=False, lut=None) -> None\n\n"
              "The box (x0, y0, x1, y1: float pixels) of an RGB image (uint8 [height, width, 3]) resampled to\n"
              "out_height x out_width as Pillow's bilinear resize does it, mirrored with flip, written into out as\n"
              "planes: uint8 [3, out_height, out_width], or through lut (3 x 256 float32 or float16 values) as those."),
    CH_METHOD(tokens_window,
              "tokens_window(indices, seq_len, starts, sources, itemsize, input_ids, labels) -> None\n\n"
              "pack='concat' windows: window w is stream[w*L : w*L + L + 1] of the shards' tokens (uint16 or\n"
              "uint32, itemsize 2 or 4) one after the other; starts: int64 token offsets of the shards (S + 1);\n"
              "sources[s]: None or (tokens buffer, base item). input_ids, labels: int64 [n, L]."),
    CH_METHOD(tokens_plan,
              "tokens_plan(doc_offsets, seq_len, out=None) -> int\n\n"
              "The number of sequences of next-fit packing of the documents (int64 token offsets, D + 1)\n"
              "into sequences of at most seq_len tokens; with out (int64, count + 1): their boundaries."),
    CH_METHOD(tokens_packed,
              "tokens_packed(indices, offsets, sources, itemsize, seq_len, pad_id, input_ids, labels,\n"
              "position_ids, cu_seqlens) -> int\n\n"
              "pack='documents' rows: sources[s] is None or (tokens, doc_offsets int64, plan int64) of shard s.\n"
              "Fills the int64 [n, L] outputs and cu_seqlens (int32, at least n*L + 1); returns its length."),
    {NULL, NULL, 0, NULL},
};

static const char unmapped_doc[] =
    "A shard the call needs is not mapped (its source is None). Nothing was copied.\n\n"
    "Attribute shard: the lowest such shard number. Map it and call again.";

static const char corrupt_doc[] =
    "A shard's buffers do not hold what its structure claims (too short, offsets out of\n"
    "order or out of bounds, invalid UTF-8). Nothing was copied.\n\n"
    "Attributes shard and row (the row within the shard, or -1).";

static int module_exec(PyObject *module)
{
    NativeState *state = ch_state(module);
    state->unmapped = PyErr_NewExceptionWithDoc("chute._native.Unmapped", unmapped_doc, PyExc_LookupError, NULL);
    if (state->unmapped == NULL)
        return -1;
    state->corrupt = PyErr_NewExceptionWithDoc("chute._native.CorruptShard", corrupt_doc, PyExc_ValueError, NULL);
    if (state->corrupt == NULL)
        return -1;
    if (PyModule_AddObjectRef(module, "Unmapped", state->unmapped) < 0)
        return -1;
    if (PyModule_AddObjectRef(module, "CorruptShard", state->corrupt) < 0)
        return -1;
    /* The instruction sets of the SIMD kernels compiled in (each used where the CPU has it): none in a
     * build with -DCHUTE_NO_SIMD or off x86-64. */
#ifdef CH_X86_SIMD
    PyObject *simd = Py_BuildValue("(sss)", "ssse3", "sse4.1", "avx2");
#else
    PyObject *simd = PyTuple_New(0);
#endif
    if (simd == NULL || PyModule_AddObject(module, "SIMD", simd) < 0) {
        Py_XDECREF(simd);
        return -1;
    }
    return ch_add_ring_type(module);
}

static int module_traverse(PyObject *module, visitproc visit, void *arg)
{
    NativeState *state = ch_state(module);
    Py_VISIT(state->unmapped);
    Py_VISIT(state->corrupt);
    return 0;
}

static int module_clear(PyObject *module)
{
    NativeState *state = ch_state(module);
    Py_CLEAR(state->unmapped);
    Py_CLEAR(state->corrupt);
    return 0;
}

static void module_free(void *module)
{
    module_clear((PyObject *)module);
}

/* The kernels need no GIL: the module's state (its two exception classes) is set once at import; each
 * call works on its own arguments, private copies and buffers it exports and holds for the call; list
 * items are taken as new references (ch_item_ref). Free-threaded builds (3.13+) keep the GIL off. */
static PyModuleDef_Slot slots[] = {
    {Py_mod_exec, module_exec},
#if PY_VERSION_HEX >= 0x030D0000
    {Py_mod_gil, Py_MOD_GIL_NOT_USED},
#endif
    {0, NULL},
};

static struct PyModuleDef moduledef = {
    PyModuleDef_HEAD_INIT,
    .m_name = "chute._native",
    .m_doc = "chute's native kernels: batch gathers from memory-mapped shards, bulk decoding of\n"
             "variable-length columns into Python objects, the order's Feistel permutation, and images' RGB\n"
             "interleaved-to-planes copy and resample.",
    .m_size = sizeof(NativeState),
    .m_methods = methods,
    .m_slots = slots,
    .m_traverse = module_traverse,
    .m_clear = module_clear,
    .m_free = module_free,
};

PyMODINIT_FUNC PyInit__native(void)
{
    return PyModuleDef_Init(&moduledef);
}
