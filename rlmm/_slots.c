/* Building instances of slotted classes from values already checked, in C, for a rebuild's hot path.
 *
 * Optional, like rlmm/_avro_reader.c: setup.py builds it when a C compiler is there. rlmm.types.slot_maker uses it
 * for the frozen dataclasses a rebuild builds per record (a segment, its id, its UUID, its key, an epoch's lineage),
 * which Python builds as object.__new__ and one object.__setattr__ per field: about 0.2 us a field, most of a
 * decoded record's cost. A maker does the same (no __init__, no __post_init__, no __setattr__) in one call.
 *
 *   maker(cls, fields) -> make(*values)   make builds a cls with each named slot set to its value, in order
 *
 * maker raises TypeError unless cls is a plain class (a class statement's, every class in its chain of bases a class
 * statement's up to object, with object's __new__ and allocator: what object.__new__(cls) builds completely) and
 * every field is a plain object slot of cls (a writable member descriptor of cls or of a base of it, as __slots__
 * makes, inside the instance), named once; make raises TypeError unless given exactly one value per field. A class
 * whose __new__ (or whose base's, as a dict's or an exception's) sets up more than slots is refused, as
 * object.__new__ refuses it: an instance of it without that set up would crash its first use.
 *
 * The maker holds cls; make holds each value it stores (the instance owns them) and returns a new reference. A class
 * given a __new__ after its maker was made still gets instances without it, as object.__new__ would build them: the
 * layout, all make relies on, cannot change.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>
#include <structmember.h>

/* The maker's state, the `self` of each make call: the class and its slots' offsets in field order. */
typedef struct {
    PyTypeObject *cls;
    Py_ssize_t count;
    Py_ssize_t offsets[];
} Spec;

static void
spec_free(PyObject *capsule)
{
    Spec *spec = PyCapsule_GetPointer(capsule, "rlmm._slots.spec");
    if (spec != NULL) {
        Py_DECREF(spec->cls);
        PyMem_Free(spec);
    }
}

static PyObject *
make(PyObject *capsule, PyObject *const *args, Py_ssize_t nargs)
{
    Spec *spec = PyCapsule_GetPointer(capsule, "rlmm._slots.spec");
    if (spec == NULL) {
        return NULL;
    }
    if (nargs != spec->count) {
        PyErr_Format(PyExc_TypeError, "%s maker takes %zd values, got %zd", spec->cls->tp_name, spec->count, nargs);
        return NULL;
    }
    PyObject *object = spec->cls->tp_alloc(spec->cls, 0);
    if (object == NULL) {
        return NULL;
    }
    /* A new object's slots are NULL, and maker refused a field named twice: nothing to release. */
    for (Py_ssize_t i = 0; i < nargs; i++) {
        *(PyObject **)((char *)object + spec->offsets[i]) = Py_NewRef(args[i]);
    }
    return object;
}

static PyMethodDef make_def = {
    "make", (PyCFunction)(void (*)(void))make, METH_FASTCALL,
    PyDoc_STR("make(*values) -> an instance with its slots set to the values, in the maker's field order"),
};

/* Whether instances of cls are all object.__new__(cls) builds: see the module's comment. */
static int
plain_class(PyTypeObject *cls)
{
    if (cls->tp_new != PyBaseObject_Type.tp_new || cls->tp_alloc != PyType_GenericAlloc || cls->tp_itemsize != 0
        || (cls->tp_flags & Py_TPFLAGS_IS_ABSTRACT)) {
        return 0;
    }
    for (PyTypeObject *base = cls; base != &PyBaseObject_Type; base = base->tp_base) {
        if (base == NULL || !(base->tp_flags & Py_TPFLAGS_HEAPTYPE)) {
            return 0;
        }
    }
    return 1;
}

/* The offset of a writable object slot of cls named `name` (inside its instances), or -1 with no error set. */
static Py_ssize_t
slot_offset(PyTypeObject *cls, PyObject *name)
{
    PyObject *descriptor = PyUnicode_CheckExact(name) ? PyObject_GetAttr((PyObject *)cls, name) : NULL;
    Py_ssize_t offset = -1;
    if (descriptor == NULL) {
        PyErr_Clear();
    }
    else if (Py_IS_TYPE(descriptor, &PyMemberDescr_Type) && PyType_IsSubtype(cls, PyDescr_TYPE(descriptor))) {
        PyMemberDef *member = ((PyMemberDescrObject *)descriptor)->d_member;
        int plain = member->type == T_OBJECT_EX && !(member->flags & READONLY)
                    && member->offset >= (Py_ssize_t)sizeof(PyObject)
                    && member->offset <= cls->tp_basicsize - (Py_ssize_t)sizeof(PyObject *);
#ifdef Py_RELATIVE_OFFSET
        plain = plain && !(member->flags & Py_RELATIVE_OFFSET);
#endif
        offset = plain ? member->offset : -1;
    }
    Py_XDECREF(descriptor);
    return offset;
}

/* maker(cls, fields) -> make: see the module's comment. */
static PyObject *
slots_maker(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2 || !PyType_Check(args[0]) || !PyTuple_CheckExact(args[1])) {
        PyErr_SetString(PyExc_TypeError, "maker(cls: type, fields: tuple[str, ...])");
        return NULL;
    }
    PyTypeObject *cls = (PyTypeObject *)args[0];
    PyObject *fields = args[1];
    Py_ssize_t count = PyTuple_GET_SIZE(fields);
    if (!plain_class(cls)) {
        PyErr_Format(PyExc_TypeError, "%s is not a plain class (a class statement's, over object's __new__, "
                     "abstract methods, or its bases' layouts): object.__new__ cannot build it complete", cls->tp_name);
        return NULL;
    }
    Spec *spec = PyMem_Malloc(sizeof(Spec) + (size_t)count * sizeof(Py_ssize_t));
    if (spec == NULL) {
        return PyErr_NoMemory();
    }
    spec->cls = cls;
    spec->count = count;
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *name = PyTuple_GET_ITEM(fields, i);
        /* May run Python code (a metaclass's attribute lookup): the fields tuple and cls are the caller's, held for
         * the call; the offset is checked against cls itself, whose layout no code can change. */
        spec->offsets[i] = slot_offset(cls, name);
        int plain = spec->offsets[i] >= 0;
        for (Py_ssize_t j = 0; plain && j < i; j++) {
            plain = spec->offsets[j] != spec->offsets[i];
        }
        if (!plain) {
            PyMem_Free(spec);
            PyErr_Format(PyExc_TypeError, "%R is not a slot of %s named once", name, cls->tp_name);
            return NULL;
        }
    }
    Py_INCREF(cls);
    PyObject *capsule = PyCapsule_New(spec, "rlmm._slots.spec", spec_free);
    if (capsule == NULL) {
        Py_DECREF(cls);
        PyMem_Free(spec);
        return NULL;
    }
    PyObject *function = PyCFunction_New(&make_def, capsule);
    Py_DECREF(capsule);
    return function;
}

/* --- unpacking a packed segment (rlmm/packed.py) ------------------------------------------------------------------
 *
 *   unpacker(make_segment, make_segment_id, make_uuid, make_epochs, states, safety, fallback) -> unpack(packed, tp)
 *
 * rlmm.packed holds a hosted segment as one bytes object; a lookup unpacks the one it answers. unpack reads the plain
 * layouts (HEAD_SIZE bytes, a state `states` has, no flag but "transaction index empty" and "custom metadata
 * follows", and with the latter exactly the custom metadata's bytes after the head) in C, as rlmm.packed's Python
 * unpack reads them, and builds the metadata with the makers it was given:
 *
 *   make_uuid(id as int, safety), make_segment_id(tp, uuid), make_epochs(epoch, epoch start),
 *   make_segment(segment id, start, end, max timestamp, broker, event timestamp, size, epochs, custom metadata or
 *                None, state, txn)
 *
 * Any other argument (another type, length or layout) goes to fallback(packed, tp), the Python unpack, which reads it
 * or raises what it raises. The makers are called like any callable (whatever code they run, unpack holds what it
 * passes them); the unpacker keeps them in the tuple `unpack` is bound to, which no code can change. */

#define HEAD_SIZE 70
#define FLAG_TXN_IDX_EMPTY 1
#define FLAG_CUSTOM 2

enum { U_MAKE_SEGMENT, U_MAKE_ID, U_MAKE_UUID, U_MAKE_EPOCHS, U_STATES, U_SAFETY, U_FALLBACK, U_COUNT };

static unsigned long long
big_endian(const unsigned char *at, int width)
{
    unsigned long long value = 0;
    for (int i = 0; i < width; i++) {
        value = (value << 8) | at[i];
    }
    return value;
}

static PyObject *
signed64(const unsigned char *at)
{
    unsigned long long bits = big_endian(at, 8);
    long long value;
    memcpy(&value, &bits, sizeof value);
    return PyLong_FromLongLong(value);
}

static PyObject *
signed32(const unsigned char *at)
{
    uint32_t bits = (uint32_t)big_endian(at, 4);
    int32_t value;
    memcpy(&value, &bits, sizeof value);
    return PyLong_FromLong(value);
}

static PyObject *
unpack(PyObject *spec, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_Format(PyExc_TypeError, "unpack(packed, tp) takes 2 arguments, got %zd", nargs);
        return NULL;
    }
    PyObject *states = PyTuple_GET_ITEM(spec, U_STATES);
    PyObject *packed = args[0];
    const unsigned char *at = PyBytes_CheckExact(packed) ? (const unsigned char *)PyBytes_AS_STRING(packed) : NULL;
    Py_ssize_t size = at == NULL ? 0 : PyBytes_GET_SIZE(packed);
    /* Flags 57: bit 0 "transaction index empty", bit 1 "custom metadata follows" (its length, 4 bytes big-endian,
     * then its bytes, ending the packed bytes exactly); any other bit sends the argument to the fallback. */
    int custom = size >= HEAD_SIZE && (at[57] & FLAG_CUSTOM);
    if (size < HEAD_SIZE || (at[57] & ~(FLAG_TXN_IDX_EMPTY | FLAG_CUSTOM)) || at[56] >= PyTuple_GET_SIZE(states)
            || (custom ? size < HEAD_SIZE + 4 || size - HEAD_SIZE - 4 != (Py_ssize_t)big_endian(at + HEAD_SIZE, 4)
                       : size != HEAD_SIZE)) {
        return PyObject_Vectorcall(PyTuple_GET_ITEM(spec, U_FALLBACK), args, 2, NULL);
    }
    /* Offsets: start 0, end 8, id 16, max timestamp 32, event timestamp 40, broker 48, size 52, state 56, flags 57,
     * epoch 58, epoch start 62 (rlmm.packed._HEAD). */
    PyObject *made[11] = {NULL};
    enum { START, END, ID_INT, MAX_TS, EVENT_TS, BROKER, SIZE, EPOCH, EPOCH_START, CUSTOM, UUID };
    PyObject *segment_id = NULL, *epochs = NULL, *result = NULL;
    made[START] = signed64(at);
    made[END] = signed64(at + 8);
    made[ID_INT] = _PyLong_FromByteArray(at + 16, 16, 0, 0);
    made[MAX_TS] = signed64(at + 32);
    made[EVENT_TS] = signed64(at + 40);
    made[BROKER] = signed32(at + 48);
    made[SIZE] = signed32(at + 52);
    made[EPOCH] = signed32(at + 58);
    made[EPOCH_START] = signed64(at + 62);
    made[CUSTOM] = custom ? PyBytes_FromStringAndSize((const char *)at + HEAD_SIZE + 4, size - HEAD_SIZE - 4)
                          : Py_NewRef(Py_None);
    for (int i = 0; i < UUID; i++) {
        if (made[i] == NULL) {
            goto done;
        }
    }
    PyObject *uuid_args[] = {made[ID_INT], PyTuple_GET_ITEM(spec, U_SAFETY)};
    made[UUID] = PyObject_Vectorcall(PyTuple_GET_ITEM(spec, U_MAKE_UUID), uuid_args, 2, NULL);
    if (made[UUID] == NULL) {
        goto done;
    }
    PyObject *id_args[] = {args[1], made[UUID]};
    segment_id = PyObject_Vectorcall(PyTuple_GET_ITEM(spec, U_MAKE_ID), id_args, 2, NULL);
    if (segment_id == NULL) {
        goto done;
    }
    PyObject *epoch_args[] = {made[EPOCH], made[EPOCH_START]};
    epochs = PyObject_Vectorcall(PyTuple_GET_ITEM(spec, U_MAKE_EPOCHS), epoch_args, 2, NULL);
    if (epochs == NULL) {
        goto done;
    }
    PyObject *segment_args[] = {segment_id, made[START], made[END], made[MAX_TS], made[BROKER], made[EVENT_TS],
                                made[SIZE], epochs, made[CUSTOM], PyTuple_GET_ITEM(states, at[56]),
                                (at[57] & FLAG_TXN_IDX_EMPTY) ? Py_True : Py_False};
    result = PyObject_Vectorcall(PyTuple_GET_ITEM(spec, U_MAKE_SEGMENT), segment_args, 11, NULL);
done:
    for (int i = 0; i <= UUID; i++) {
        Py_XDECREF(made[i]);
    }
    Py_XDECREF(segment_id);
    Py_XDECREF(epochs);
    return result;
}

static PyMethodDef unpack_def = {
    "unpack", (PyCFunction)(void (*)(void))unpack, METH_FASTCALL,
    PyDoc_STR("unpack(packed, tp) -> the segment rlmm.packed packed (plain layouts in C, others by the fallback)"),
};

/* unpacker(...) -> unpack: see above. */
static PyObject *
slots_unpacker(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    int valid = nargs == U_COUNT && PyTuple_CheckExact(args[U_STATES]);
    for (Py_ssize_t i = 0; valid && i < U_COUNT; i++) {
        valid = i == U_STATES || i == U_SAFETY || PyCallable_Check(args[i]);
    }
    if (!valid) {
        PyErr_SetString(PyExc_TypeError, "unpacker(make_segment, make_segment_id, make_uuid, make_epochs, "
                                         "states: tuple, safety, fallback): the makers and fallback callable");
        return NULL;
    }
    PyObject *spec = PyTuple_New(U_COUNT);
    if (spec == NULL) {
        return NULL;
    }
    for (Py_ssize_t i = 0; i < U_COUNT; i++) {
        PyTuple_SET_ITEM(spec, i, Py_NewRef(args[i]));
    }
    PyObject *function = PyCFunction_New(&unpack_def, spec);
    Py_DECREF(spec);
    return function;
}

static PyMethodDef slots_methods[] = {
    {"maker", (PyCFunction)(void (*)(void))slots_maker, METH_FASTCALL,
     PyDoc_STR("maker(cls, fields) -> make(*values), building a cls with its slots set, without __init__")},
    {"unpacker", (PyCFunction)(void (*)(void))slots_unpacker, METH_FASTCALL,
     PyDoc_STR("unpacker(make_segment, make_segment_id, make_uuid, make_epochs, states, safety, fallback) -> "
               "unpack(packed, tp): rlmm.packed's unpack, in C for its plain layout")},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef slots_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "rlmm._slots",
    .m_doc = PyDoc_STR("Builds instances of slotted classes from checked values in C (optional; rlmm.types builds "
                       "them in Python without it)."),
    .m_size = -1,
    .m_methods = slots_methods,
};

PyMODINIT_FUNC
PyInit__slots(void)
{
    return PyModule_Create(&slots_module);
}
