/* Reading Avro binary data of tierlog's own event schemas in C, for a rebuild's hot path (rlmm.codec.decode_datum).
 *
 * Optional, like rlmm/_segment_lookup.c: setup.py builds it when a C compiler is there. fastavro stays the
 * reference: it encodes every event, resolves older writer schemas and words every decoding error. This reader only
 * reads a datum written with the reader's own schema, which rlmm.codec compiles into a "program" of nested tuples:
 *
 *   (OP_NULL,) (OP_BOOLEAN,) (OP_INT,) (OP_LONG,) (OP_STRING,) (OP_BYTES,)
 *   (OP_ENUM, (symbol, ...))            the symbol, as a str
 *   (OP_UNION, (program, ...))          the branch's value
 *   (OP_ARRAY, program)                 a list
 *   (OP_RECORD, ((name, program), ...)) a dict, fields in order
 *   (OP_TUPLE, (program, ...))          a record as a tuple of its fields' values, in order (for a reader that
 *                                       takes them by position: no dict to build, nor names to look up)
 *
 * and gives what fastavro's schemaless_reader gives for the same bytes (tests/rlmm/test_rlmm_avro_reader.py holds
 * the two equal on random data of every schema, and on garbage). Anything it does not read exactly (truncated
 * bytes, an out-of-range index, a boolean not 0 or 1, invalid UTF-8, a varint past 64 bits) raises ValueError, and
 * the caller then asks fastavro, which decodes or says what is wrong. Bytes after the datum are ignored, as fastavro
 * ignores them.
 *
 * A program is an argument like any other: read() checks each node of it as it runs it (an exact tuple of the shape
 * above, enum symbols and field names exact str) and raises TypeError for one that is not, so no program makes it
 * read outside a tuple or run Python code. check() checks a whole program at once (rlmm.codec asks it once per
 * schema): read() never raises TypeError for a program check() took. Nothing read is borrowed past the call: the
 * program's tuples and the data are held by the caller for its duration, and what read() returns is new.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

enum { OP_NULL, OP_BOOLEAN, OP_INT, OP_LONG, OP_STRING, OP_BYTES, OP_ENUM, OP_UNION, OP_ARRAY, OP_RECORD, OP_TUPLE };

#define MAX_DEPTH 32

typedef struct {
    const unsigned char *at;
    const unsigned char *end;
} Cursor;

static PyObject *
fail(const char *what)
{
    PyErr_SetString(PyExc_ValueError, what);
    return NULL;
}

/* A zigzag varint (Avro int and long alike); 0 on success, -1 with ValueError set. */
static int
read_long(Cursor *cursor, long long *value)
{
    unsigned long long bits = 0;
    int shift = 0;
    while (cursor->at < cursor->end) {
        unsigned char byte = *cursor->at++;
        if (shift == 63 && (byte & 0x7e)) {
            break; /* past 64 bits */
        }
        bits |= (unsigned long long)(byte & 0x7f) << shift;
        if (!(byte & 0x80)) {
            *value = (long long)(bits >> 1) ^ -(long long)(bits & 1);
            return 0;
        }
        shift += 7;
        if (shift > 63) {
            break;
        }
    }
    PyErr_SetString(PyExc_ValueError, "truncated or overlong varint");
    return -1;
}

/* The next `length` bytes, or NULL with ValueError set. */
static const unsigned char *
take(Cursor *cursor, long long length)
{
    if (length < 0 || length > cursor->end - cursor->at) {
        PyErr_SetString(PyExc_ValueError, "length out of range");
        return NULL;
    }
    const unsigned char *start = cursor->at;
    cursor->at += length;
    return start;
}

/* The op of a program node, and its argument (NULL for a primitive: an enum's symbols, a union's branches, an
 * array's item program, a record's fields, a tuple's field programs); -1 with TypeError set for a node not of a shape above. */
static long
node_op(PyObject *program, PyObject **argument)
{
    if (PyTuple_CheckExact(program) && PyTuple_GET_SIZE(program) >= 1
        && PyLong_CheckExact(PyTuple_GET_ITEM(program, 0))) {
        int overflow = 0;
        long op = PyLong_AsLongAndOverflow(PyTuple_GET_ITEM(program, 0), &overflow);
        Py_ssize_t size = PyTuple_GET_SIZE(program);
        if (op >= OP_NULL && op <= OP_BYTES && size == 1) {
            *argument = NULL;
            return op;
        }
        if (op >= OP_ENUM && op <= OP_TUPLE && size == 2) {
            *argument = PyTuple_GET_ITEM(program, 1);
            if (op == OP_ARRAY || PyTuple_CheckExact(*argument)) {
                return op;
            }
        }
    }
    PyErr_SetString(PyExc_TypeError, "not an Avro reader program: a node is not (op,) or (op, argument) "
                                     "of the shapes rlmm/_avro_reader.c describes");
    return -1;
}

/* A record field (name, program), or 0 with TypeError set. */
static int
is_field(PyObject *field)
{
    if (PyTuple_CheckExact(field) && PyTuple_GET_SIZE(field) == 2 && PyUnicode_CheckExact(PyTuple_GET_ITEM(field, 0))) {
        return 1;
    }
    PyErr_SetString(PyExc_TypeError, "not an Avro reader program: a record field is not (name: str, program)");
    return 0;
}

/* An enum symbol, or 0 with TypeError set. */
static int
is_symbol(PyObject *symbol)
{
    if (PyUnicode_CheckExact(symbol)) {
        return 1;
    }
    PyErr_SetString(PyExc_TypeError, "not an Avro reader program: an enum symbol is not a str");
    return 0;
}

static PyObject *read_datum(PyObject *program, Cursor *cursor, int depth);

static PyObject *
read_array(PyObject *items, Cursor *cursor, int depth)
{
    PyObject *list = PyList_New(0);
    if (list == NULL) {
        return NULL;
    }
    for (;;) {
        long long count;
        if (read_long(cursor, &count) < 0) {
            goto error;
        }
        if (count == 0) {
            return list;
        }
        if (count < 0) { /* a block with its size in bytes first */
            long long size;
            if (count == LLONG_MIN || read_long(cursor, &size) < 0) {
                if (!PyErr_Occurred()) {
                    fail("array block count out of range");
                }
                goto error;
            }
            count = -count;
        }
        if (count > cursor->end - cursor->at) {
            /* More items than bytes left: only items of no bytes (nulls) fit, which tierlog's schemas never hold in
             * an array. Left to fastavro, so that a garbled count never runs a long loop here. */
            fail("array block count past the data");
            goto error;
        }
        for (long long i = 0; i < count; i++) {
            PyObject *item = read_datum(items, cursor, depth + 1);
            if (item == NULL) {
                goto error;
            }
            int added = PyList_Append(list, item);
            Py_DECREF(item);
            if (added < 0) {
                goto error;
            }
        }
    }
error:
    Py_DECREF(list);
    return NULL;
}

static PyObject *
read_record(PyObject *fields, Cursor *cursor, int depth)
{
    PyObject *record = PyDict_New();
    if (record == NULL) {
        return NULL;
    }
    Py_ssize_t count = PyTuple_GET_SIZE(fields);
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *field = PyTuple_GET_ITEM(fields, i);
        if (!is_field(field)) {
            Py_DECREF(record);
            return NULL;
        }
        PyObject *value = read_datum(PyTuple_GET_ITEM(field, 1), cursor, depth + 1);
        if (value == NULL) {
            Py_DECREF(record);
            return NULL;
        }
        int set = PyDict_SetItem(record, PyTuple_GET_ITEM(field, 0), value);
        Py_DECREF(value);
        if (set < 0) {
            Py_DECREF(record);
            return NULL;
        }
    }
    return record;
}

/* A record read as a tuple of its fields' values (`programs`: each field's program, in order). */
static PyObject *
read_tuple(PyObject *programs, Cursor *cursor, int depth)
{
    Py_ssize_t count = PyTuple_GET_SIZE(programs);
    PyObject *record = PyTuple_New(count);
    if (record == NULL) {
        return NULL;
    }
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *value = read_datum(PyTuple_GET_ITEM(programs, i), cursor, depth + 1);
        if (value == NULL) {
            Py_DECREF(record); /* the items set so far go with it; the rest are NULL, which tuples allow */
            return NULL;
        }
        PyTuple_SET_ITEM(record, i, value);
    }
    return record;
}

static PyObject *
read_datum(PyObject *program, Cursor *cursor, int depth)
{
    if (depth > MAX_DEPTH) {
        return fail("schema nested too deep");
    }
    PyObject *argument;
    long op = node_op(program, &argument);
    long long value;
    const unsigned char *bytes;
    switch (op) {
    case OP_NULL:
        Py_RETURN_NONE;
    case OP_BOOLEAN:
        if (cursor->at >= cursor->end || *cursor->at > 1) {
            return fail("boolean not 0 or 1");
        }
        return PyBool_FromLong(*cursor->at++);
    case OP_INT:
    case OP_LONG:
        return read_long(cursor, &value) < 0 ? NULL : PyLong_FromLongLong(value);
    case OP_STRING:
    case OP_BYTES:
        if (read_long(cursor, &value) < 0 || (bytes = take(cursor, value)) == NULL) {
            return NULL;
        }
        if (op == OP_BYTES) {
            return PyBytes_FromStringAndSize((const char *)bytes, (Py_ssize_t)value);
        }
        PyObject *text = PyUnicode_DecodeUTF8((const char *)bytes, (Py_ssize_t)value, "strict");
        if (text == NULL) {
            PyErr_Clear();
            return fail("string not UTF-8");
        }
        return text;
    case OP_ENUM:
    case OP_UNION: {
        if (read_long(cursor, &value) < 0) {
            return NULL;
        }
        if (value < 0 || value >= PyTuple_GET_SIZE(argument)) {
            return fail("enum or union index out of range");
        }
        PyObject *choice = PyTuple_GET_ITEM(argument, (Py_ssize_t)value);
        if (op == OP_UNION) {
            return read_datum(choice, cursor, depth + 1);
        }
        return is_symbol(choice) ? Py_NewRef(choice) : NULL;
    }
    case OP_ARRAY:
        return read_array(argument, cursor, depth);
    case OP_RECORD:
        return read_record(argument, cursor, depth);
    case OP_TUPLE:
        return read_tuple(argument, cursor, depth);
    default: /* node_op refused the node */
        return NULL;
    }
}

/* Whether every node of a program is one read_datum runs (node_op), its symbols and fields too: a program read()
 * runs without TypeError whatever the bytes. */
static int
check_program(PyObject *program, int depth)
{
    PyObject *argument;
    long op = depth > MAX_DEPTH ? -1 : node_op(program, &argument);
    if (op < 0) {
        PyErr_Clear();
        return 0;
    }
    Py_ssize_t count = argument != NULL && op != OP_ARRAY ? PyTuple_GET_SIZE(argument) : 0;
    int good = 1;
    for (Py_ssize_t i = 0; good && i < count; i++) {
        PyObject *item = PyTuple_GET_ITEM(argument, i);
        good = op == OP_ENUM ? is_symbol(item)
               : op == OP_UNION || op == OP_TUPLE ? check_program(item, depth + 1)
               : is_field(item) && check_program(PyTuple_GET_ITEM(item, 1), depth + 1);
    }
    if (good && op == OP_ARRAY) {
        good = check_program(argument, depth + 1);
    }
    PyErr_Clear();
    return good;
}

/* check(program) -> bool: whether `read` can run the program. */
static PyObject *
avro_check(PyObject *module, PyObject *program)
{
    return PyBool_FromLong(check_program(program, 0));
}

/* read(program, data, start) -> the datum encoded in data[start:]; ValueError when the bytes are not read exactly. */
static PyObject *
avro_read(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3 || !PyBytes_CheckExact(args[1]) || !PyLong_CheckExact(args[2])) {
        PyErr_SetString(PyExc_TypeError, "read(program, data: bytes, start: int)");
        return NULL;
    }
    Py_ssize_t start = PyLong_AsSsize_t(args[2]);
    Py_ssize_t size = PyBytes_GET_SIZE(args[1]);
    if (start < 0 || start > size) {
        PyErr_Clear(); /* an int past Py_ssize_t's range is out of range too */
        PyErr_SetString(PyExc_ValueError, "read: start out of range of the data");
        return NULL;
    }
    const unsigned char *data = (const unsigned char *)PyBytes_AS_STRING(args[1]);
    Cursor cursor = {data + start, data + size};
    return read_datum(args[0], &cursor, 0);
}

static PyMethodDef avro_methods[] = {
    {"check", (PyCFunction)avro_check, METH_O, PyDoc_STR("check(program) -> whether read() can run it")},
    {"read", (PyCFunction)(void (*)(void))avro_read, METH_FASTCALL,
     PyDoc_STR("read(program, data, start) -> the datum; ValueError for bytes it does not read exactly")},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef avro_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "rlmm._avro_reader",
    .m_doc = PyDoc_STR("Reads Avro binary data of tierlog's own schemas in C (optional; rlmm.codec uses fastavro "
                       "without it)."),
    .m_size = -1,
    .m_methods = avro_methods,
};

PyMODINIT_FUNC
PyInit__avro_reader(void)
{
    PyObject *module = PyModule_Create(&avro_module);
    if (module == NULL) {
        return NULL;
    }
    static const struct { const char *name; long value; } ops[] = {
        {"OP_NULL", OP_NULL}, {"OP_BOOLEAN", OP_BOOLEAN}, {"OP_INT", OP_INT}, {"OP_LONG", OP_LONG},
        {"OP_STRING", OP_STRING}, {"OP_BYTES", OP_BYTES}, {"OP_ENUM", OP_ENUM}, {"OP_UNION", OP_UNION},
        {"OP_ARRAY", OP_ARRAY}, {"OP_RECORD", OP_RECORD}, {"OP_TUPLE", OP_TUPLE},
    };
    for (size_t i = 0; i < sizeof(ops) / sizeof(ops[0]); i++) {
        if (PyModule_AddIntConstant(module, ops[i].name, ops[i].value) < 0) {
            Py_DECREF(module);
            return NULL;
        }
    }
    return module;
}
