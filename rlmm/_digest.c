/* The view digest's framing of a run of entries in C, for a snapshot bootstrap's hot path (rlmm.state.ViewDigest).
 *
 * Optional, like rlmm/_slots.c: setup.py builds it when a C compiler is there. The view digest is sha256 over each
 * entry's column family, key and value, each prefixed with its length as 4 bytes big-endian. Python builds that
 * framing as a list of five parts per entry and joins it: about 0.7 us an entry, most of checking a snapshot's
 * digest. frame() builds the same bytes in one pass.
 *
 *   frame(family: bytes, keys: list[bytes], values: list[bytes]) -> bytes
 *
 * TypeError unless keys and values are lists of bytes of one length; ValueError for a part of 4 GiB or more, which
 * a 4-byte length cannot frame.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

static int
check_length(Py_ssize_t length)
{
    if ((unsigned long long)length > 0xffffffffULL) {
        PyErr_SetString(PyExc_ValueError, "an entry's part is 4 GiB or more: its length does not fit 4 bytes");
        return -1;
    }
    return 0;
}

static char *
put(char *at, const char *data, Py_ssize_t length)
{
    at[0] = (char)((length >> 24) & 0xff);
    at[1] = (char)((length >> 16) & 0xff);
    at[2] = (char)((length >> 8) & 0xff);
    at[3] = (char)(length & 0xff);
    memcpy(at + 4, data, (size_t)length);
    return at + 4 + length;
}

static PyObject *
digest_frame(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3 || !PyBytes_CheckExact(args[0]) || !PyList_CheckExact(args[1]) || !PyList_CheckExact(args[2])
        || PyList_GET_SIZE(args[1]) != PyList_GET_SIZE(args[2])) {
        PyErr_SetString(PyExc_TypeError, "frame(family: bytes, keys: list[bytes], values: list[bytes]) of as many "
                                         "keys as values");
        return NULL;
    }
    PyObject *family = args[0], *keys = args[1], *values = args[2];
    Py_ssize_t count = PyList_GET_SIZE(keys);
    Py_ssize_t family_size = PyBytes_GET_SIZE(family);
    if (check_length(family_size) < 0) {
        return NULL;
    }
    /* The size first: every item checked, so the copy below runs no Python code (the lists cannot change). */
    Py_ssize_t total = 0;
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *key = PyList_GET_ITEM(keys, i), *value = PyList_GET_ITEM(values, i);
        if (!PyBytes_CheckExact(key) || !PyBytes_CheckExact(value)) {
            PyErr_Format(PyExc_TypeError, "entry %zd: keys and values must be bytes", i);
            return NULL;
        }
        Py_ssize_t key_size = PyBytes_GET_SIZE(key), value_size = PyBytes_GET_SIZE(value);
        if (check_length(key_size) < 0 || check_length(value_size) < 0) {
            return NULL;
        }
        Py_ssize_t entry = 12 + family_size + key_size + value_size;
        if (total > PY_SSIZE_T_MAX - entry) {
            return PyErr_NoMemory();
        }
        total += entry;
    }
    PyObject *framed = PyBytes_FromStringAndSize(NULL, total);
    if (framed == NULL) {
        return NULL;
    }
    char *at = PyBytes_AS_STRING(framed);
    const char *family_data = PyBytes_AS_STRING(family);
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *key = PyList_GET_ITEM(keys, i), *value = PyList_GET_ITEM(values, i);
        at = put(at, family_data, family_size);
        at = put(at, PyBytes_AS_STRING(key), PyBytes_GET_SIZE(key));
        at = put(at, PyBytes_AS_STRING(value), PyBytes_GET_SIZE(value));
    }
    return framed;
}

static PyMethodDef digest_methods[] = {
    {"frame", (PyCFunction)(void (*)(void))digest_frame, METH_FASTCALL,
     PyDoc_STR("frame(family, keys, values) -> the view digest's bytes of the entries, each part length-prefixed")},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef digest_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "rlmm._digest",
    .m_doc = PyDoc_STR("Frames a run of view entries for the view digest in C (optional; rlmm.state frames them in "
                       "Python without it)."),
    .m_size = -1,
    .m_methods = digest_methods,
};

PyMODINIT_FUNC
PyInit__digest(void)
{
    return PyModule_Create(&digest_module);
}
