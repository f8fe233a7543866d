/* The broker's fetch-path lookup (RemoteLogMetadataManager.remote_log_segment_metadata) for a partition already found
 * readable, in C: the same steps as the method's lock-free path, without the interpreter's per-step cost.
 *
 * Optional: setup.py builds it when a C compiler is there, and rlmm.manager falls back to the method alone when it
 * is missing. A SegmentLookup answers only what the lock-free path answers; anything else (another type of
 * argument, a negative or huge number, a partition not yet readable, halted or deleted, keyword arguments) goes to
 * the Python method it was given, which makes every check and raises every error. So both paths answer alike by
 * construction, and tests/rlmm/test_rlmm_native_lookup.py checks it on random states.
 *
 * A random lookup over thousands of partitions is bound by cache misses, not by instructions: each object it reaches
 * is one more trip to memory. So the manager's partitions found readable are kept in a ReadableTable, a mapping
 * (topic id as int, partition) -> _Readable like the dict it replaces, whose slots hold the key's 128 + 64 bits
 * inline (no key object to compare), and beside each readable a flat copy of its snapshot's sole floors: the starts,
 * ends and answers in one block, rebuilt when the read model publishes another snapshot (the block keeps the one it
 * was built from, and a lookup compares that with the readable's current one).
 *
 * What it reads, all kept current by the manager and the read model (rlmm/manager.py, rlmm/read_model.py):
 *   table:    ReadableTable (topic id as int, partition) -> _Readable (topic, metadata_partition, snapshot)
 *   halted:   dict metadata partition -> error
 *   snapshot: PartitionSnapshot (deleted, sole_epoch, sole_segments, sole_bounds, floors)
 *   floors:   EpochFloors (segments: tuple, bounds: array('q') of the n starts then the n ends)
 *
 * None of that is trusted (rlmm/README.md, "The C extensions", lists what each extension assumes): every attribute
 * read may run Python code (a property, a metaclass), which may change the table or the objects read, so
 *   - what a lookup keeps or uses after such a read it holds by a strong reference (the flat floors hold the
 *     snapshot and its sole_segments tuple, whose items are the answers), and a table slot is found again after it;
 *   - a slot read in place (no reference taken) is read only at an offset checked against the object's type: the
 *     offset of a __slots__ member descriptor owned by that type or a base of it, inside the type's basicsize;
 *   - anything not as expected (another type, a missing slot, a bounds array of another format or too short) sends
 *     the call to the fallback, which raises what the Python method raises.
 * A published snapshot is never changed (rlmm/read_model.py): one changed in place anyway may be answered from the
 * copy made before the change, never from freed memory.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <structmember.h>

/* --- ReadableTable ------------------------------------------------------------------------------------------ */

/* A snapshot's sole floors, flat: n starts, n ends, then n answers (the items of the snapshot's sole_segments tuple,
 * held here: the snapshot's attribute may be replaced, never the tuple's items). `snapshot` is held too, so that no
 * other snapshot can take its address while the copy is compared with the readable's current one. `sole_epoch` -1:
 * the snapshot has no sole epoch (none, or several). */
typedef struct {
    PyObject *snapshot;
    PyObject *segments;
    long long sole_epoch;
    int deleted;
    Py_ssize_t count;
    long long data[];
} Floors;

#define FLOORS_STARTS(f) ((f)->data)
#define FLOORS_ENDS(f) ((f)->data + (f)->count)
#define FLOORS_ANSWERS(f) ((PyObject **)((f)->data + 2 * (f)->count))

#define SLOT_EMPTY (-1)
#define SLOT_REMOVED (-2)

typedef struct {
    uint64_t high, low;   /* the topic id's 128 bits */
    long long partition;  /* >= 0; or SLOT_EMPTY, SLOT_REMOVED */
    PyObject *readable;   /* a strong reference while the slot is used */
    Floors *floors;       /* NULL until a lookup needs it */
} Slot;

typedef struct {
    PyObject_HEAD
    Slot *slots;
    Py_ssize_t capacity; /* a power of two */
    Py_ssize_t used;     /* slots holding a readable */
    Py_ssize_t filled;   /* used + removed: what probing walks over */
} ReadableTable;

typedef struct {
    PyObject_HEAD
    ReadableTable *table; /* never replaced (cleared in place on close) */
    PyObject *halted;     /* dict, never replaced */
    PyObject *tp_type;    /* rlmm.types.TopicIdPartition: only that exact type takes this path */
    PyObject *fallback;   /* the Python method: every call this path does not answer */
    vectorcallfunc vectorcall;
    /* Where the slots a lookup reads sit in a TopicIdPartition, and in the last readable's type (read in place: a
     * new reference would write to each object's header, one more cache line to fetch); -1 when not a slot. */
    Py_ssize_t tp_topic_id, tp_topic, tp_partition;
    PyTypeObject *readable_type;
    Py_ssize_t readable_topic, readable_snapshot, readable_metadata_partition;
} SegmentLookup;

static PyTypeObject ReadableTableType;

static PyObject *str_topic_id, *str_int, *str_partition, *str_topic, *str_metadata_partition, *str_snapshot,
    *str_deleted, *str_sole_epoch, *str_sole_segments, *str_sole_bounds, *str_floors, *str_segments, *str_bounds;

/* A plain int in [0, 2**63): its value; else -1 (the caller then leaves the call to the fallback). */
static long long
plain_non_negative(PyObject *value)
{
    if (!PyLong_CheckExact(value)) {
        return -1;
    }
    int overflow = 0;
    long long result = PyLong_AsLongLongAndOverflow(value, &overflow);
    if (overflow || result < 0) {
        PyErr_Clear();
        return -1;
    }
    return result;
}

/* The 128 bits of a non-negative int below 2**128 (a UUID's `int`); -1 with an error set for anything else. */
static int
id_bits(PyObject *value, uint64_t *high, uint64_t *low)
{
    if (!PyLong_Check(value)) {
        PyErr_SetString(PyExc_TypeError, "ReadableTable: a key's topic id must be an int");
        return -1;
    }
    unsigned char bytes[16];
#if PY_VERSION_HEX >= 0x030D0000
    Py_ssize_t needed = PyLong_AsNativeBytes(value, bytes, 16, Py_ASNATIVEBYTES_LITTLE_ENDIAN
                                             | Py_ASNATIVEBYTES_UNSIGNED_BUFFER | Py_ASNATIVEBYTES_REJECT_NEGATIVE);
    if (needed < 0) {
        return -1;
    }
    if (needed > 16) {
        PyErr_SetString(PyExc_OverflowError, "ReadableTable: a key's topic id must be below 2**128");
        return -1;
    }
#else
    if (_PyLong_AsByteArray((PyLongObject *)value, bytes, 16, 1, 0) < 0) {
        return -1;
    }
#endif
    uint64_t h = 0, l = 0;
    for (int i = 7; i >= 0; i--) {
        l = (l << 8) | bytes[i];
        h = (h << 8) | bytes[8 + i];
    }
    *high = h;
    *low = l;
    return 0;
}

/* A key (topic id as int, partition) as bits; -1 with an error set when it is not one. */
static int
key_bits(PyObject *key, uint64_t *high, uint64_t *low, long long *partition)
{
    if (!PyTuple_Check(key) || PyTuple_GET_SIZE(key) != 2) {
        PyErr_SetString(PyExc_TypeError, "ReadableTable: a key is a tuple (topic id as int, partition)");
        return -1;
    }
    if (id_bits(PyTuple_GET_ITEM(key, 0), high, low) < 0) {
        return -1;
    }
    PyObject *p = PyTuple_GET_ITEM(key, 1);
    long long value = PyLong_Check(p) ? PyLong_AsLongLong(p) : -1;
    if (value < 0) {
        if (!PyErr_Occurred() || PyErr_ExceptionMatches(PyExc_OverflowError)) {
            PyErr_Clear();
            PyErr_SetString(PyExc_ValueError, "ReadableTable: a key's partition must be an int in [0, 2**63)");
        }
        return -1;
    }
    *partition = value;
    return 0;
}

static inline size_t
slot_hash(uint64_t high, uint64_t low, long long partition)
{
    uint64_t h = (high ^ (low * 0x9E3779B97F4A7C15ULL) ^ ((uint64_t)partition * 0xC2B2AE3D27D4EB4FULL));
    h ^= h >> 29;
    h *= 0xBF58476D1CE4E5B9ULL;
    return (size_t)(h ^ (h >> 32));
}

/* The slot holding the key, or NULL. */
static inline Slot *
table_find(ReadableTable *table, uint64_t high, uint64_t low, long long partition)
{
    if (table->used == 0) {
        return NULL;
    }
    size_t mask = (size_t)table->capacity - 1;
    for (size_t i = slot_hash(high, low, partition) & mask;; i = (i + 1) & mask) {
        Slot *slot = &table->slots[i];
        if (slot->partition == partition && slot->low == low && slot->high == high) {
            return slot;
        }
        if (slot->partition == SLOT_EMPTY) {
            return NULL;
        }
    }
}

static void
floors_free(Floors *floors)
{
    if (floors != NULL) {
        Py_DECREF(floors->snapshot);
        Py_DECREF(floors->segments);
        PyMem_Free(floors);
    }
}

/* Empties a slot, handing back the references it held (the caller drops them when the table is consistent again:
 * dropping one may run arbitrary code). */
static void
slot_take(ReadableTable *table, Slot *slot, PyObject **readable, Floors **floors)
{
    *readable = slot->readable;
    *floors = slot->floors;
    slot->readable = NULL;
    slot->floors = NULL;
    slot->partition = SLOT_REMOVED;
    table->used--;
}

/* Room for one more key: a larger (or cleaned) table when probing would walk more than half of it. */
static int
table_reserve(ReadableTable *table)
{
    if ((table->filled + 1) * 2 <= table->capacity) {
        return 0;
    }
    Py_ssize_t capacity = 8;
    while (capacity < (table->used + 1) * 4) {
        capacity *= 2;
    }
    Slot *slots = PyMem_Calloc((size_t)capacity, sizeof(Slot));
    if (slots == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < capacity; i++) {
        slots[i].partition = SLOT_EMPTY;
    }
    size_t mask = (size_t)capacity - 1;
    for (Py_ssize_t i = 0; i < table->capacity; i++) {
        Slot *old = &table->slots[i];
        if (old->partition >= 0) {
            size_t at = slot_hash(old->high, old->low, old->partition) & mask;
            while (slots[at].partition != SLOT_EMPTY) {
                at = (at + 1) & mask;
            }
            slots[at] = *old;
        }
    }
    PyMem_Free(table->slots);
    table->slots = slots;
    table->capacity = capacity;
    table->filled = table->used;
    return 0;
}

static PyObject *
readable_table_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    if (PyTuple_GET_SIZE(args) != 0 || (kwargs != NULL && PyDict_GET_SIZE(kwargs) != 0)) {
        PyErr_SetString(PyExc_TypeError, "ReadableTable() takes no arguments");
        return NULL;
    }
    ReadableTable *self = (ReadableTable *)type->tp_alloc(type, 0);
    if (self == NULL) {
        return NULL;
    }
    self->slots = NULL;
    self->capacity = self->used = self->filled = 0;
    if (table_reserve(self) < 0) {
        Py_DECREF(self);
        return NULL;
    }
    return (PyObject *)self;
}

/* Whether a method got one or two positional arguments; False with TypeError set when not (the C API's own
 * check for this is not public). */
static int
one_or_two(const char *name, Py_ssize_t nargs)
{
    if (nargs == 1 || nargs == 2) {
        return 1;
    }
    PyErr_Format(PyExc_TypeError, "%s expected 1 or 2 arguments, got %zd", name, nargs);
    return 0;
}

/* The slot holding `key`, or NULL (no error set): as in a dict, a key the table cannot hold is simply absent. */
static Slot *
table_slot(ReadableTable *self, PyObject *key)
{
    uint64_t high, low;
    long long partition;
    if (key_bits(key, &high, &low, &partition) < 0) {
        PyErr_Clear();
        return NULL;
    }
    return table_find(self, high, low, partition);
}

/* table[key]: the readable, or NULL with KeyError set. A borrowed reference. */
static PyObject *
table_get(ReadableTable *self, PyObject *key)
{
    Slot *slot = table_slot(self, key);
    if (slot == NULL) {
        PyErr_SetObject(PyExc_KeyError, key);
        return NULL;
    }
    return slot->readable;
}

static PyObject *
readable_table_subscript(ReadableTable *self, PyObject *key)
{
    return Py_XNewRef(table_get(self, key));
}

static int
readable_table_ass_subscript(ReadableTable *self, PyObject *key, PyObject *value)
{
    uint64_t high, low;
    long long partition;
    if (value == NULL) { /* del table[key] */
        Slot *slot = table_slot(self, key);
        if (slot == NULL) {
            PyErr_SetObject(PyExc_KeyError, key);
            return -1;
        }
        PyObject *old_readable;
        Floors *old_floors;
        slot_take(self, slot, &old_readable, &old_floors);
        Py_DECREF(old_readable);
        floors_free(old_floors);
        return 0;
    }
    if (key_bits(key, &high, &low, &partition) < 0) {
        return -1;
    }
    PyObject *old_readable = NULL;
    Floors *old_floors = NULL;
    Slot *slot = table_find(self, high, low, partition);
    if (slot != NULL) {
        old_readable = slot->readable;
        old_floors = slot->floors;
        slot->readable = Py_NewRef(value);
        slot->floors = NULL;
    }
    else {
        if (table_reserve(self) < 0) {
            return -1;
        }
        size_t mask = (size_t)self->capacity - 1;
        size_t at = slot_hash(high, low, partition) & mask;
        while (self->slots[at].partition >= 0) {
            at = (at + 1) & mask;
        }
        slot = &self->slots[at];
        self->filled += slot->partition == SLOT_EMPTY;
        self->used++;
        *slot = (Slot){high, low, partition, Py_NewRef(value), NULL};
    }
    Py_XDECREF(old_readable);
    floors_free(old_floors);
    return 0;
}

static Py_ssize_t
readable_table_length(ReadableTable *self)
{
    return self->used;
}

static int
readable_table_contains(ReadableTable *self, PyObject *key)
{
    return table_slot(self, key) != NULL;
}

static PyObject *
readable_table_get_method(ReadableTable *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (!one_or_two("get", nargs)) {
        return NULL;
    }
    Slot *slot = table_slot(self, args[0]);
    return Py_NewRef(slot != NULL ? slot->readable : nargs == 2 ? args[1] : Py_None);
}

static PyObject *
readable_table_pop(ReadableTable *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (!one_or_two("pop", nargs)) {
        return NULL;
    }
    Slot *slot = table_slot(self, args[0]);
    if (slot == NULL) {
        if (nargs == 2) {
            return Py_NewRef(args[1]);
        }
        PyErr_SetObject(PyExc_KeyError, args[0]);
        return NULL;
    }
    PyObject *readable;
    Floors *floors;
    slot_take(self, slot, &readable, &floors);
    floors_free(floors);
    return readable; /* the slot's reference, now the caller's */
}

/* Empties the table; the references go only once it is empty. */
static void
table_clear(ReadableTable *self)
{
    Slot *slots = self->slots;
    Py_ssize_t capacity = self->capacity;
    self->slots = NULL;
    self->capacity = self->used = self->filled = 0;
    if (table_reserve(self) < 0) { /* no memory for 8 slots: the table stays empty, and says so on next use */
        PyErr_Clear();
    }
    for (Py_ssize_t i = 0; i < capacity; i++) {
        if (slots[i].partition >= 0) {
            Py_DECREF(slots[i].readable);
            floors_free(slots[i].floors);
        }
    }
    PyMem_Free(slots);
}

static PyObject *
readable_table_clear_method(ReadableTable *self, PyObject *Py_UNUSED(ignored))
{
    table_clear(self);
    Py_RETURN_NONE;
}

static int
readable_table_traverse(ReadableTable *self, visitproc visit, void *arg)
{
    for (Py_ssize_t i = 0; i < self->capacity; i++) {
        if (self->slots[i].partition >= 0) {
            Py_VISIT(self->slots[i].readable);
            if (self->slots[i].floors != NULL) {
                Py_VISIT(self->slots[i].floors->snapshot);
                Py_VISIT(self->slots[i].floors->segments);
            }
        }
    }
    return 0;
}

static int
readable_table_tp_clear(ReadableTable *self)
{
    table_clear(self);
    return 0;
}

static void
readable_table_dealloc(ReadableTable *self)
{
    PyObject_GC_UnTrack(self);
    table_clear(self);
    PyMem_Free(self->slots);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMappingMethods readable_table_as_mapping = {
    .mp_length = (lenfunc)readable_table_length,
    .mp_subscript = (binaryfunc)readable_table_subscript,
    .mp_ass_subscript = (objobjargproc)readable_table_ass_subscript,
};

static PySequenceMethods readable_table_as_sequence = {
    .sq_contains = (objobjproc)readable_table_contains,
};

static PyMethodDef readable_table_methods[] = {
    {"get", (PyCFunction)(void (*)(void))readable_table_get_method, METH_FASTCALL,
     "get(key, default=None): the readable of key, or default"},
    {"pop", (PyCFunction)(void (*)(void))readable_table_pop, METH_FASTCALL,
     "pop(key[, default]): remove key and return its readable (default, or KeyError, without one)"},
    {"clear", (PyCFunction)readable_table_clear_method, METH_NOARGS, "remove every key"},
    {NULL},
};

static PyTypeObject ReadableTableType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "rlmm._segment_lookup.ReadableTable",
    .tp_doc = PyDoc_STR("ReadableTable(): a mapping (topic id as int, partition) -> readable, as the manager's dict "
                        "of partitions found readable, laid out for SegmentLookup"),
    .tp_basicsize = sizeof(ReadableTable),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_new = readable_table_new,
    .tp_traverse = (traverseproc)readable_table_traverse,
    .tp_clear = (inquiry)readable_table_tp_clear,
    .tp_dealloc = (destructor)readable_table_dealloc,
    .tp_as_mapping = &readable_table_as_mapping,
    .tp_as_sequence = &readable_table_as_sequence,
    .tp_methods = readable_table_methods,
    .tp_hash = PyObject_HashNotImplemented,
};

/* --- SegmentLookup ------------------------------------------------------------------------------------------ */

/* EpochFloors.floor's position: the index of the greatest start <= offset, if offset <= that entry's end; else -1. */
static inline Py_ssize_t
floor_index(const long long *starts, const long long *ends, Py_ssize_t count, long long offset)
{
    Py_ssize_t low = 0, high = count; /* bisect_right over the starts */
    while (low < high) {
        Py_ssize_t middle = low + (high - low) / 2;
        if (offset < starts[middle]) {
            high = middle;
        }
        else {
            low = middle + 1;
        }
    }
    return low && offset <= ends[low - 1] ? low - 1 : -1;
}

/* The floor of `offset` among (segments, bounds): the entry with the greatest start <= offset, if offset <= its end;
 * else None (EpochFloors.floor). A new reference, or NULL with an error set. */
static PyObject *
floor_of(PyObject *segments, PyObject *bounds, long long offset)
{
    if (!PyTuple_CheckExact(segments)) {
        PyErr_SetString(PyExc_TypeError, "EpochFloors.segments must be a tuple");
        return NULL;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(bounds, &view, PyBUF_FORMAT | PyBUF_C_CONTIGUOUS) < 0) {
        return NULL;
    }
    Py_ssize_t count = PyTuple_GET_SIZE(segments);
    if (view.itemsize != (Py_ssize_t)sizeof(long long) || view.format == NULL || view.format[0] != 'q'
        || view.len < 2 * count * (Py_ssize_t)sizeof(long long)) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_TypeError, "EpochFloors.bounds must be an array('q') of the starts, then the ends");
        return NULL;
    }
    const long long *starts = (const long long *)view.buf;
    Py_ssize_t at = floor_index(starts, starts + count, count, offset);
    PyObject *found = at < 0 ? Py_None : PyTuple_GET_ITEM(segments, at);
    PyBuffer_Release(&view);
    return Py_NewRef(found);
}

/* The offset of the object slot `name` in instances of `type` (a __slots__ member), or -1. Only a member descriptor
 * owned by `type` or a base of it counts (one taken from another class and set on this one describes another
 * layout), and only an offset inside the instance: slot_value then reads it without further checks. May run Python
 * code (a metaclass's attribute lookup). */
static Py_ssize_t
member_offset(PyTypeObject *type, PyObject *name)
{
    PyObject *descriptor = PyObject_GetAttr((PyObject *)type, name);
    Py_ssize_t offset = -1;
    if (descriptor == NULL) {
        PyErr_Clear();
    }
    else if (Py_IS_TYPE(descriptor, &PyMemberDescr_Type) && PyType_IsSubtype(type, PyDescr_TYPE(descriptor))) {
        PyMemberDef *member = ((PyMemberDescrObject *)descriptor)->d_member;
        int plain = member->type == T_OBJECT_EX && member->offset >= (Py_ssize_t)sizeof(PyObject)
                    && member->offset <= type->tp_basicsize - (Py_ssize_t)sizeof(PyObject *);
#ifdef Py_RELATIVE_OFFSET
        plain = plain && !(member->flags & Py_RELATIVE_OFFSET);
#endif
        offset = plain ? member->offset : -1;
    }
    Py_XDECREF(descriptor);
    return offset;
}

/* The object in a slot at `offset` (from member_offset), borrowed; NULL when unset or the offset unknown. */
static inline PyObject *
slot_value(PyObject *object, Py_ssize_t offset)
{
    return offset < 0 ? NULL : *(PyObject **)((char *)object + offset);
}

/* The flat copy of a snapshot's sole floors, or NULL with an error set. Its attribute reads may run Python code:
 * the caller holds the snapshot, and finds any table slot again afterwards. */
static Floors *
floors_of(PyObject *snapshot)
{
    Floors *floors = NULL;
    PyObject *deleted = PyObject_GetAttr(snapshot, str_deleted);
    PyObject *sole_epoch = deleted == NULL ? NULL : PyObject_GetAttr(snapshot, str_sole_epoch);
    PyObject *segments = sole_epoch == NULL ? NULL : PyObject_GetAttr(snapshot, str_sole_segments);
    PyObject *bounds = segments == NULL ? NULL : PyObject_GetAttr(snapshot, str_sole_bounds);
    Py_buffer view = {0};
    if (bounds == NULL) {
        goto done;
    }
    long long epoch = PyLong_CheckExact(sole_epoch) ? PyLong_AsLongLong(sole_epoch) : -2;
    if (PyErr_Occurred()) {
        goto done;
    }
    if ((deleted != Py_True && deleted != Py_False) || epoch < -1 || !PyTuple_CheckExact(segments)) {
        if (!PyErr_Occurred()) {
            PyErr_SetString(PyExc_TypeError, "a snapshot's deleted, sole_epoch or sole_segments is not as expected");
        }
        goto done;
    }
    if (PyObject_GetBuffer(bounds, &view, PyBUF_FORMAT | PyBUF_C_CONTIGUOUS) < 0) {
        goto done;
    }
    Py_ssize_t count = PyTuple_GET_SIZE(segments);
    if (view.itemsize != (Py_ssize_t)sizeof(long long) || view.format == NULL || view.format[0] != 'q'
        || view.len < 2 * count * (Py_ssize_t)sizeof(long long)) {
        PyErr_SetString(PyExc_TypeError, "a snapshot's sole_bounds must be an array('q') of the starts, then the ends");
        goto done;
    }
    Py_BUILD_ASSERT(sizeof(PyObject *) <= sizeof(long long));
    floors = PyMem_Malloc(sizeof(Floors) + 3 * (size_t)count * sizeof(long long));
    if (floors == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    floors->snapshot = Py_NewRef(snapshot);
    floors->segments = Py_NewRef(segments);
    floors->sole_epoch = epoch;
    floors->deleted = deleted == Py_True;
    floors->count = count;
    memcpy(floors->data, view.buf, 2 * (size_t)count * sizeof(long long));
    for (Py_ssize_t i = 0; i < count; i++) {
        FLOORS_ANSWERS(floors)[i] = PyTuple_GET_ITEM(segments, i);
    }
done:
    if (view.obj != NULL) {
        PyBuffer_Release(&view);
    }
    Py_XDECREF(deleted);
    Py_XDECREF(sole_epoch);
    Py_XDECREF(segments);
    Py_XDECREF(bounds);
    return floors;
}

/* The answer from the floors of a snapshot's other epochs (snapshot.floors[epoch]), or NULL with an error set. */
static PyObject *
answer_other_epoch(PyObject *snapshot, PyObject *epoch, long long offset)
{
    PyObject *floors_by_epoch = PyObject_GetAttr(snapshot, str_floors);
    if (floors_by_epoch == NULL || !PyDict_CheckExact(floors_by_epoch)) {
        Py_XDECREF(floors_by_epoch);
        return PyErr_Occurred() ? NULL : PyErr_Format(PyExc_TypeError, "a snapshot's floors must be a dict");
    }
    PyObject *floors = PyDict_GetItemWithError(floors_by_epoch, epoch); /* borrowed */
    Py_XINCREF(floors);
    Py_DECREF(floors_by_epoch);
    if (floors == NULL) {
        return PyErr_Occurred() ? NULL : Py_NewRef(Py_None); /* no floors in that epoch: nothing to find */
    }
    PyObject *result = NULL;
    PyObject *segments = PyObject_GetAttr(floors, str_segments);
    PyObject *bounds = segments == NULL ? NULL : PyObject_GetAttr(floors, str_bounds);
    Py_DECREF(floors);
    if (bounds != NULL) {
        result = floor_of(segments, bounds, offset);
    }
    Py_XDECREF(segments);
    Py_XDECREF(bounds);
    return result;
}

/* The answer for a readable partition (found in the table under these bits), or NULL with no error set when the
 * fallback must answer. `readable` is held by the caller; anything else read in place is read before any Python
 * code can run, or held across it. */
static PyObject *
answer(SegmentLookup *self, PyObject *readable, PyObject *tp, PyObject *epoch_object, long long epoch,
       long long offset, uint64_t high, uint64_t low, long long partition)
{
    PyTypeObject *type = Py_TYPE(readable);
    Py_ssize_t topic_at, snapshot_at, metadata_partition_at;
    if (type == self->readable_type) {
        topic_at = self->readable_topic;
        snapshot_at = self->readable_snapshot;
        metadata_partition_at = self->readable_metadata_partition;
    }
    else {
        /* Found for this type (held: the Python code finding them may run could reassign the readable's class),
         * then stored with it in one step: that code may also look up another readable type meanwhile. The type
         * replaced goes last. */
        Py_INCREF(type);
        topic_at = member_offset(type, str_topic);
        snapshot_at = member_offset(type, str_snapshot);
        metadata_partition_at = member_offset(type, str_metadata_partition);
        PyTypeObject *replaced_type = self->readable_type;
        self->readable_type = type;
        self->readable_topic = topic_at;
        self->readable_snapshot = snapshot_at;
        self->readable_metadata_partition = metadata_partition_at;
        Py_XDECREF(replaced_type);
    }
    /* An object's class can be reassigned only to one of the same layout: offsets found for `type` stay inside
     * `readable` whatever Python code runs below. */
    PyObject *theirs = slot_value(readable, topic_at), *ours = slot_value(tp, self->tp_topic);
    if (theirs == NULL || ours == NULL) {
        return NULL;
    }
    if (theirs != ours) { /* comparing may run Python code, which may replace either slot's value */
        Py_INCREF(theirs);
        Py_INCREF(ours);
        int same = PyObject_RichCompareBool(theirs, ours, Py_EQ);
        Py_DECREF(theirs);
        Py_DECREF(ours);
        if (same <= 0) {
            PyErr_Clear();
            return NULL;
        }
    }
    if (PyDict_GET_SIZE(self->halted) > 0) {
        PyObject *metadata_partition = slot_value(readable, metadata_partition_at);
        if (metadata_partition == NULL) {
            return NULL;
        }
        Py_INCREF(metadata_partition); /* hashing it may run Python code */
        int halted = PyDict_Contains(self->halted, metadata_partition);
        Py_DECREF(metadata_partition);
        if (halted != 0) {
            PyErr_Clear();
            return NULL;
        }
    }
    PyObject *snapshot = slot_value(readable, snapshot_at);
    if (snapshot == NULL) {
        return NULL;
    }
    /* The slot again (the steps above may have run Python code): still this readable's, or the fallback answers.
     * Its flat floors are rebuilt when the read model has published another snapshot since. */
    Slot *slot = table_find(self->table, high, low, partition);
    if (slot == NULL || slot->readable != readable) {
        return NULL;
    }
    Floors *floors = slot->floors, *replaced = NULL;
    PyObject *held = NULL; /* the snapshot, once Python code may run while it is used */
    if (floors == NULL || floors->snapshot != snapshot) {
        held = Py_NewRef(snapshot);
        floors = floors_of(snapshot);
        /* Reading the snapshot's attributes may have run Python code, which may have grown the table (moving its
         * slots) or removed the partition: the slot is found again before the floors go into it. */
        slot = floors == NULL ? NULL : table_find(self->table, high, low, partition);
        if (slot == NULL || slot->readable != readable) {
            floors_free(floors);
            Py_DECREF(held);
            PyErr_Clear();
            return NULL;
        }
        replaced = slot->floors;
        slot->floors = floors;
    }
    /* No Python code has run since `floors` was read from (or put in) the slot: it is alive. For a deleted
     * partition the fallback answers (it refuses the partition). */
    PyObject *result = NULL;
    if (!floors->deleted && epoch == floors->sole_epoch) {
        Py_ssize_t at = floor_index(FLOORS_STARTS(floors), FLOORS_ENDS(floors), floors->count, offset);
        result = Py_NewRef(at < 0 ? Py_None : FLOORS_ANSWERS(floors)[at]);
    }
    else if (!floors->deleted) {
        if (held == NULL) {
            held = Py_NewRef(snapshot);
        }
        result = answer_other_epoch(snapshot, epoch_object, offset);
        if (result == NULL) {
            PyErr_Clear();
        }
    }
    floors_free(replaced);
    Py_XDECREF(held);
    return result;
}

static PyObject *
segment_lookup_vectorcall(PyObject *callable, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    SegmentLookup *self = (SegmentLookup *)callable;
    if (self->fallback == NULL) { /* cleared by the garbage collector (tp_clear): nothing left to answer with */
        PyErr_SetString(PyExc_ReferenceError, "SegmentLookup: called after it was cleared");
        return NULL;
    }
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (nargs == 3 && kwnames == NULL && (PyObject *)Py_TYPE(args[0]) == self->tp_type) {
        PyObject *tp = args[0];
        long long epoch = plain_non_negative(args[1]);
        long long offset = epoch < 0 ? -1 : plain_non_negative(args[2]);
        if (offset >= 0) {
            PyObject *topic_id = slot_value(tp, self->tp_topic_id);
            PyObject *id = NULL;
            if (topic_id != NULL) { /* held while its attribute is read: that may run Python code */
                Py_INCREF(topic_id);
                id = PyObject_GetAttr(topic_id, str_int);
                Py_DECREF(topic_id);
            }
            PyObject *partition_object = slot_value(tp, self->tp_partition);
            uint64_t high = 0, low = 0;
            long long partition = partition_object == NULL ? -1 : plain_non_negative(partition_object);
            int known = partition >= 0 && id != NULL && id_bits(id, &high, &low) == 0;
            Py_XDECREF(id);
            Slot *slot = known ? table_find(self->table, high, low, partition) : NULL;
            if (slot != NULL) {
                PyObject *readable = Py_NewRef(slot->readable); /* a stop may drop the table's reference */
                PyObject *found = answer(self, readable, tp, args[1], epoch, offset, high, low, partition);
                Py_DECREF(readable);
                if (found != NULL) {
                    return found;
                }
            }
            PyErr_Clear();
        }
    }
    return PyObject_Vectorcall(self->fallback, args, nargsf, kwnames);
}

static PyObject *
segment_lookup_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    static char *keywords[] = {"table", "halted", "tp_type", "fallback", NULL};
    PyObject *table, *halted, *tp_type, *fallback;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O!O!O!O:SegmentLookup", keywords, &ReadableTableType, &table,
                                     &PyDict_Type, &halted, &PyType_Type, &tp_type, &fallback)) {
        return NULL;
    }
    if (!PyCallable_Check(fallback)) {
        PyErr_SetString(PyExc_TypeError, "SegmentLookup: fallback must be callable");
        return NULL;
    }
    SegmentLookup *self = (SegmentLookup *)type->tp_alloc(type, 0);
    if (self == NULL) {
        return NULL;
    }
    self->table = (ReadableTable *)Py_NewRef(table);
    self->halted = Py_NewRef(halted);
    self->tp_type = Py_NewRef(tp_type);
    self->tp_topic_id = member_offset((PyTypeObject *)tp_type, str_topic_id);
    self->tp_topic = member_offset((PyTypeObject *)tp_type, str_topic);
    self->tp_partition = member_offset((PyTypeObject *)tp_type, str_partition);
    self->readable_type = NULL;
    self->fallback = Py_NewRef(fallback);
    self->vectorcall = segment_lookup_vectorcall;
    return (PyObject *)self;
}

static int
segment_lookup_traverse(SegmentLookup *self, visitproc visit, void *arg)
{
    Py_VISIT(self->table);
    Py_VISIT(self->halted);
    Py_VISIT(self->tp_type);
    Py_VISIT(self->readable_type);
    Py_VISIT(self->fallback);
    return 0;
}

static int
segment_lookup_clear(SegmentLookup *self)
{
    Py_CLEAR(self->table);
    Py_CLEAR(self->halted);
    Py_CLEAR(self->tp_type);
    Py_CLEAR(self->readable_type);
    Py_CLEAR(self->fallback);
    return 0;
}

static void
segment_lookup_dealloc(SegmentLookup *self)
{
    PyObject_GC_UnTrack(self);
    segment_lookup_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMemberDef segment_lookup_members[] = {
    {"__vectorcalloffset__", T_PYSSIZET, offsetof(SegmentLookup, vectorcall), READONLY, NULL},
    {"fallback", T_OBJECT, offsetof(SegmentLookup, fallback), READONLY, "the method answering the rest"},
    {NULL},
};

static PyTypeObject SegmentLookupType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "rlmm._segment_lookup.SegmentLookup",
    .tp_doc = PyDoc_STR("SegmentLookup(table, halted, tp_type, fallback): "
                        "called as fallback(tp, leader_epoch, offset), answering a readable partition's lookup in C"),
    .tp_basicsize = sizeof(SegmentLookup),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_new = segment_lookup_new,
    .tp_traverse = (traverseproc)segment_lookup_traverse,
    .tp_clear = (inquiry)segment_lookup_clear,
    .tp_dealloc = (destructor)segment_lookup_dealloc,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(SegmentLookup, vectorcall),
    .tp_members = segment_lookup_members,
};

static struct PyModuleDef segment_lookup_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "rlmm._segment_lookup",
    .m_doc = PyDoc_STR("The fetch path's segment lookup in C (optional; rlmm.manager falls back to Python)."),
    .m_size = -1,
};

PyMODINIT_FUNC
PyInit__segment_lookup(void)
{
    struct { PyObject **slot; const char *name; } names[] = {
        {&str_topic_id, "topic_id"}, {&str_int, "int"}, {&str_partition, "partition"}, {&str_topic, "topic"},
        {&str_metadata_partition, "metadata_partition"}, {&str_snapshot, "snapshot"}, {&str_deleted, "deleted"},
        {&str_sole_epoch, "sole_epoch"}, {&str_sole_segments, "sole_segments"}, {&str_sole_bounds, "sole_bounds"},
        {&str_floors, "floors"}, {&str_segments, "segments"}, {&str_bounds, "bounds"},
    };
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        if (*names[i].slot == NULL && (*names[i].slot = PyUnicode_InternFromString(names[i].name)) == NULL) {
            return NULL;
        }
    }
    if (PyType_Ready(&SegmentLookupType) < 0 || PyType_Ready(&ReadableTableType) < 0) {
        return NULL;
    }
    PyObject *module = PyModule_Create(&segment_lookup_module);
    if (module == NULL) {
        return NULL;
    }
    if (PyModule_AddObjectRef(module, "SegmentLookup", (PyObject *)&SegmentLookupType) < 0
        || PyModule_AddObjectRef(module, "ReadableTable", (PyObject *)&ReadableTableType) < 0) {
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
