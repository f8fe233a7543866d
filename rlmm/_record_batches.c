/* Kafka's record batches (magic 2) read in C, for a worker's raw read of the metadata topic (rlmm.raw_fetch).
 *
 * Optional, like the other extensions: setup.py builds it when a C compiler is there, and rlmm/record_batches.py is
 * its reference (tests/native/fuzz_record_batches.py checks that they agree on any bytes). librdkafka's consumer
 * hands Python one Message object per record, about 1.3 us each: most of a rebuild's read of the topic. This reads
 * the bytes a Fetch response holds for a partition into (offset, key, value) tuples in one pass.
 *
 *   read(data: bytes, start: int, end: int, decompress) -> (records: list, next_offset: int, transactional: bool)
 *
 * The records of the whole batches in data with offsets in [start, end); the offset after the last whole batch (-1
 * when none is whole); whether it stopped at a transactional or control batch. decompress(codec, payload) gives a
 * compressed batch's records as bytes. TypeError for arguments of other types; ValueError for bytes that do not frame
 * exactly, with the reference's message.
 *
 *   keep(newest, superseded_tombstones, partition, records, expected, cleaned, tombstone_prefix, only=None)
 *   read_keep(data, start, end, decompress, newest, superseded_tombstones, partition, expected, cleaned,
 *             tombstone_prefix, only) -> (records read, next_offset, transactional, expected, cleaned)
 *
 * keep is rlmm.record_batches.keep: a compacted window's keeping of a run of records. read_keep reads and keeps in one
 * pass, making no object of a record `only` passes by (most of them, where a node loads the partitions its broker
 * hosts first): what read then keep give. On an exception, what it kept before it stays in newest (its callers
 * discard the window).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <limits.h>
#include <stdint.h>
#include <string.h>

#define HEADER_BYTES 61
#define MAGIC 2
#define CODEC_MASK 0x07
#define TRANSACTIONAL 0x10
#define CONTROL 0x20
#define MAX_BASE_OFFSET (INT64_MAX - ((int64_t)1 << 36))

static int64_t
be64(const unsigned char *p)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) {
        v = (v << 8) | p[i];
    }
    return (int64_t)v;
}

static int32_t
be32(const unsigned char *p)
{
    return (int32_t)(((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | (uint32_t)p[3]);
}

/* A zigzag varint of at most `most` bytes (5 or 10) at *at, below limit; *at moves past it. -1 with ValueError set
 * when it is cut short or runs past `most` bytes. */
static int
varint(const unsigned char *data, Py_ssize_t limit, Py_ssize_t *at, int most, int64_t *out)
{
    uint64_t raw = 0;
    for (int i = 0; i < most; i++) {
        if (*at + i >= limit) {
            PyErr_SetString(PyExc_ValueError, "a number is cut short");
            return -1;
        }
        unsigned char byte = data[*at + i];
        if (i < 10) {
            raw |= (i * 7 < 64) ? ((uint64_t)(byte & 0x7F) << (i * 7)) : 0;
        }
        if (!(byte & 0x80)) {
            *at += i + 1;
            *out = (int64_t)(raw >> 1) ^ -(int64_t)(raw & 1);
            return 0;
        }
    }
    PyErr_Format(PyExc_ValueError, "a number runs past %d bytes", most);
    return -1;
}

/* A key, value or header part at *at: where its bytes start (NULL for length -1) and how many; *at moves past it.
 * -1 with ValueError set when it runs past `limit`. */
static int
span(const unsigned char *data, Py_ssize_t size, Py_ssize_t *at, Py_ssize_t limit, const char **start,
     Py_ssize_t *length)
{
    int64_t raw_length;
    if (varint(data, size, at, 5, &raw_length) < 0) {
        return -1;
    }
    if (raw_length == -1) {
        *start = NULL;
        *length = 0;
        return 0;
    }
    if (raw_length < 0 || *at + raw_length > limit) {
        PyErr_Format(PyExc_ValueError, "a key, value or header of %lld bytes runs past its record",
                     (long long)raw_length);
        return -1;
    }
    *start = (const char *)data + *at;
    *length = (Py_ssize_t)raw_length;
    *at += *length;
    return 0;
}

/* A part as a new reference: bytes, or Py_None for a null one. */
static PyObject *
part_object(const char *start, Py_ssize_t length)
{
    return start == NULL ? Py_NewRef(Py_None) : PyBytes_FromStringAndSize(start, length);
}

/* Where the text `<topic id>:<partition>` of a record key (rlmm.events.RecordKey) is in it: before a segment key's id
 * (":" and 36 characters), else the key's second and third fields; rlmm.record_batches.partition_text is its
 * reference. */
static void
partition_span(const char *key, Py_ssize_t length, const char **text, Py_ssize_t *text_length)
{
    if (length > 45 && memcmp(key, "segment:", 8) == 0 && key[length - 37] == ':') {
        *text = key + 8;
        *text_length = length - 45;
        return;
    }
    const char *first = memchr(key, ':', (size_t)length);
    if (first == NULL) {
        *text = key;
        *text_length = 0;
        return;
    }
    const char *end = key + length;
    const char *second = memchr(first + 1, ':', (size_t)(end - first - 1));
    const char *third = second == NULL ? NULL : memchr(second + 1, ':', (size_t)(end - second - 1));
    *text = first + 1;
    *text_length = (third == NULL ? end : third) - first - 1;
}

/* The view key `named` holds for a partition text (a new reference: bytes, or None for text naming no partition);
 * where it holds none, `name(text)` names it and it is remembered there (*named_now set). NULL with an exception. */
static PyObject *
named_key(const char *text, Py_ssize_t text_length, PyObject *named, PyObject *name, int *named_now)
{
    PyObject *text_object = PyBytes_FromStringAndSize(text, text_length);
    if (text_object == NULL) {
        return NULL;
    }
    PyObject *tp_key = PyDict_GetItemWithError(named, text_object);  /* borrowed */
    if (tp_key != NULL) {
        Py_INCREF(tp_key);
    } else if (!PyErr_Occurred()) {
        *named_now = 1;
        tp_key = PyObject_CallOneArg(name, text_object);
        if (tp_key != NULL && PyDict_SetItem(named, text_object, tp_key) < 0) {
            Py_CLEAR(tp_key);
        }
    }
    Py_DECREF(text_object);
    return tp_key;
}

/* A metadata partition's records name a few dozen user partitions, over and over: each text's view key is remembered
 * for the call in a small table (by a hash of the text) and `named` asked only for a text not there, so that a record
 * costs no new object. The table is emptied whenever `name` runs (any Python code may change `named`). */
#define NAMED_SLOTS 64
#define NAMED_TEXT_BYTES 64

typedef struct {
    Py_ssize_t length; /* of the text; -1: empty */
    char text[NAMED_TEXT_BYTES];
    PyObject *tp_key; /* held */
} NamedSlot;

/* A compacted window's keeping of one metadata partition's records (keep, read_keep): borrowed from the call's
 * arguments (held by its caller until it returns; `only`'s items by the tuple), where the partition's offsets stand,
 * and the view keys of the partition texts met (keeper_release lets them go). */
typedef struct {
    PyObject *newest, *superseded, *partition, *prefix;
    PyObject *first, *named, *name; /* `only`'s, or NULL: every record kept */
    int wanted;
    long long expected;
    int cleaned;
    NamedSlot slots[NAMED_SLOTS];
} Keeper;

static void
keeper_forget(Keeper *keeper)
{
    for (int i = 0; i < NAMED_SLOTS; i++) {
        keeper->slots[i].length = -1;
        Py_CLEAR(keeper->slots[i].tp_key);
    }
}

/* Whether the user partition the record key key[0:length] names is in `first`, or it names none (1), or not (0); -1
 * with an exception. */
static int
keeper_in_first(Keeper *keeper, const char *key, Py_ssize_t length)
{
    const char *text;
    Py_ssize_t text_length;
    partition_span(key, length, &text, &text_length);
    NamedSlot *slot = NULL;
    PyObject *tp_key = NULL;
    if (text_length <= NAMED_TEXT_BYTES) {
        /* A topic id's first characters and the text's last (the partition's number), mixed: texts alike there share
         * a slot, which the comparison below tells apart. */
        uint64_t head = 0, tail = 0;
        memcpy(&head, text, (size_t)(text_length < 8 ? text_length : 8));
        memcpy(&tail, text + (text_length < 8 ? 0 : text_length - 8), (size_t)(text_length < 8 ? text_length : 8));
        uint64_t hash = (head * 0x9E3779B97F4A7C15ull) ^ (tail * 0xC2B2AE3D27D4EB4Full) ^ (uint64_t)text_length;
        slot = &keeper->slots[(hash >> 32) % NAMED_SLOTS];
        if (slot->length == text_length && memcmp(slot->text, text, (size_t)text_length) == 0) {
            tp_key = Py_NewRef(slot->tp_key);
        }
    }
    if (tp_key == NULL) {
        int named_now = 0;
        tp_key = named_key(text, text_length, keeper->named, keeper->name, &named_now);
        if (tp_key == NULL) {
            return -1;
        }
        if (named_now) {
            keeper_forget(keeper);
        }
        if (slot != NULL) {
            Py_XSETREF(slot->tp_key, Py_NewRef(tp_key));
            memcpy(slot->text, text, (size_t)text_length);
            slot->length = text_length;
        }
    }
    int found = tp_key == Py_None ? 1 : PySet_Contains(keeper->first, tp_key);
    Py_DECREF(tp_key);
    return found;
}

static const char KEEPER_ARGUMENTS[] = "newest: dict, superseded_tombstones: list, partition: int, expected: int, "
                                       "cleaned: bool, tombstone_prefix: bytes, only: (first: set, named: dict, "
                                       "name, wanted: bool) | None";

/* A Keeper of the arguments (keeper_forget lets it go); -1 with TypeError or ValueError naming what is wrong. */
static int
keeper_of(Keeper *keeper, PyObject *newest, PyObject *superseded, PyObject *partition, PyObject *expected,
          PyObject *cleaned, PyObject *prefix, PyObject *only, const char *call)
{
    if (!PyDict_CheckExact(newest) || !PyList_CheckExact(superseded) || !PyLong_CheckExact(partition)
        || !PyLong_CheckExact(expected) || !PyBool_Check(cleaned) || !PyBytes_CheckExact(prefix)
        || (only != Py_None && (!PyTuple_CheckExact(only) || PyTuple_GET_SIZE(only) != 4
                                || !PyAnySet_CheckExact(PyTuple_GET_ITEM(only, 0))
                                || !PyDict_CheckExact(PyTuple_GET_ITEM(only, 1))
                                || !PyCallable_Check(PyTuple_GET_ITEM(only, 2))
                                || !PyBool_Check(PyTuple_GET_ITEM(only, 3))))) {
        PyErr_Format(PyExc_TypeError, "%s: its arguments are %s", call, KEEPER_ARGUMENTS);
        return -1;
    }
    int overflow = 0;
    keeper->expected = PyLong_AsLongLongAndOverflow(expected, &overflow);
    if (overflow || (keeper->expected == -1 && PyErr_Occurred())) {
        PyErr_Clear();
        PyErr_SetString(PyExc_ValueError, "expected: not an offset (int64)");
        return -1;
    }
    keeper->newest = newest;
    keeper->superseded = superseded;
    keeper->partition = partition;
    keeper->prefix = prefix;
    keeper->cleaned = cleaned == Py_True;
    keeper->first = keeper->named = keeper->name = NULL;
    keeper->wanted = 0;
    for (int i = 0; i < NAMED_SLOTS; i++) {
        keeper->slots[i].length = -1;
        keeper->slots[i].tp_key = NULL;
    }
    if (only != Py_None) {
        keeper->first = PyTuple_GET_ITEM(only, 0);
        keeper->named = PyTuple_GET_ITEM(only, 1);
        keeper->name = PyTuple_GET_ITEM(only, 2);
        keeper->wanted = PyTuple_GET_ITEM(only, 3) == Py_True;
    }
    return 0;
}

/* The next record's offset: a gap from the one expected shows the cleaner at work. Then whether its key
 * key[0:length] (b"" for a null key) is one the keeper keeps (1) or passes by (0); -1 with an exception. */
static int
keeper_wants(Keeper *keeper, long long offset, const char *key, Py_ssize_t length)
{
    if (offset != keeper->expected) {
        keeper->cleaned = 1;
    }
    keeper->expected = offset + 1;
    if (keeper->first == NULL) {
        return 1;
    }
    int found = keeper_in_first(keeper, key, length);
    return found < 0 ? -1 : found == keeper->wanted;
}

/* Keeps a wanted record (its key bytes, never None): a segment tombstone drops its key; a tombstone another record
 * supersedes goes to the superseded list. 0, or -1 with an exception. */
static int
keeper_store(Keeper *keeper, PyObject *offset_object, PyObject *key, PyObject *value)
{
    PyObject *newest = keeper->newest;
    Py_ssize_t prefix_size = PyBytes_GET_SIZE(keeper->prefix);
    if (value == Py_None && PyBytes_GET_SIZE(key) >= prefix_size
        && memcmp(PyBytes_AS_STRING(key), PyBytes_AS_STRING(keeper->prefix), (size_t)prefix_size) == 0) {
        int held = PyDict_Contains(newest, key);
        return held < 0 || (held > 0 && PyDict_DelItem(newest, key) < 0) ? -1 : 0;
    }
    PyObject *before = PyDict_GetItemWithError(newest, key);  /* borrowed */
    if (before == NULL && PyErr_Occurred()) {
        return -1;
    }
    int after_cleaning = keeper->cleaned;
    if (before != NULL) {
        if (!PyTuple_CheckExact(before) || PyTuple_GET_SIZE(before) < 4) {
            PyErr_SetString(PyExc_TypeError, "newest holds an entry that is not a kept record's tuple");
            return -1;
        }
        after_cleaning = PyTuple_GET_ITEM(before, 3) != Py_None;
        if (!after_cleaning && PyList_Append(keeper->superseded, before) < 0) {
            return -1;
        }
    }
    PyObject *entry = PyTuple_Pack(6, keeper->partition, offset_object, key, value, Py_None,
                                   after_cleaning ? Py_True : Py_False);
    if (entry == NULL) {
        return -1;
    }
    int stored = PyDict_SetItem(newest, key, entry);
    Py_DECREF(entry);
    return stored;
}

/* A record read from a batch, into `records` (a list) or kept by `keeper`: 0, or -1 with an exception. */
static int
take(PyObject *records, Keeper *keeper, int64_t offset, const char *key, Py_ssize_t key_length, const char *value,
     Py_ssize_t value_length)
{
    if (keeper != NULL) {
        int wanted = keeper_wants(keeper, offset, key == NULL ? "" : key, key_length);
        if (wanted <= 0) {
            return wanted;
        }
    }
    /* Each made only while no exception is set (a keeper's null key is b""). */
    PyObject *offset_object = PyLong_FromLongLong(offset);
    PyObject *key_object = offset_object == NULL ? NULL
                           : keeper != NULL && key == NULL ? PyBytes_FromStringAndSize("", 0)
                                                           : part_object(key, key_length);
    PyObject *value_object = key_object == NULL ? NULL : part_object(value, value_length);
    int taken = -1;
    if (value_object != NULL) {
        if (keeper != NULL) {
            taken = keeper_store(keeper, offset_object, key_object, value_object);
        }
        else {
            PyObject *record = PyTuple_Pack(3, offset_object, key_object, value_object);
            taken = record == NULL ? -1 : PyList_Append(records, record);
            Py_XDECREF(record);
        }
    }
    Py_XDECREF(offset_object);
    Py_XDECREF(key_object);
    Py_XDECREF(value_object);
    return taken;
}

/* The records of one batch's body with offsets in [start, end), taken (`take`); how many in *read. */
static int
records_of(const unsigned char *body, Py_ssize_t size, int64_t base, int32_t count, int64_t start, int64_t end,
           PyObject *records, Keeper *keeper, Py_ssize_t *read)
{
    Py_ssize_t at = 0;
    for (int32_t n = 0; n < count; n++) {
        int64_t length, timestamp, delta, headers;
        if (varint(body, size, &at, 5, &length) < 0) {
            return -1;
        }
        if (length < 0 || at + length > size) {
            PyErr_Format(PyExc_ValueError, "a record of batch %lld says it holds %lld bytes, past its batch",
                         (long long)base, (long long)length);
            return -1;
        }
        Py_ssize_t record_end = at + (Py_ssize_t)length;
        at += 1; /* attributes */
        if (varint(body, size, &at, 10, &timestamp) < 0 || varint(body, size, &at, 5, &delta) < 0) {
            return -1;
        }
        const char *key, *value;
        Py_ssize_t key_length, value_length;
        if (span(body, size, &at, record_end, &key, &key_length) < 0
            || span(body, size, &at, record_end, &value, &value_length) < 0
            || varint(body, size, &at, 5, &headers) < 0) {
            return -1;
        }
        if (headers < 0) {
            PyErr_Format(PyExc_ValueError, "a record of batch %lld says it holds %lld headers", (long long)base,
                         (long long)headers);
            return -1;
        }
        for (int64_t h = 0; h < headers; h++) {
            const char *name, *header_value;
            Py_ssize_t name_length, header_length;
            if (span(body, size, &at, record_end, &name, &name_length) < 0) {
                return -1;
            }
            if (name == NULL) {
                PyErr_Format(PyExc_ValueError, "a record of batch %lld holds a header without a name",
                             (long long)base);
                return -1;
            }
            if (span(body, size, &at, record_end, &header_value, &header_length) < 0) {
                return -1;
            }
        }
        if (at != record_end) {
            PyErr_Format(PyExc_ValueError, "a record of batch %lld holds %zd bytes more than it frames",
                         (long long)base, record_end - at);
            return -1;
        }
        int64_t offset = base + delta; /* base <= MAX_BASE_OFFSET and |delta| < 2**35: no overflow */
        if (offset >= start && offset < end) {
            if (take(records, keeper, offset, key, key_length, value, value_length) < 0) {
                return -1;
            }
            *read += 1;
        }
    }
    if (at != size) {
        PyErr_Format(PyExc_ValueError, "batch %lld holds %zd bytes after its %d records", (long long)base, size - at,
                     (int)count);
        return -1;
    }
    return 0;
}

/* read's and read_keep's pass over a Fetch response's bytes for one partition: the records of its whole batches with
 * offsets in [start, end) taken (`take`), how many in *read; the offset after the last whole batch in *next_offset
 * (-1 when none is whole); *transactional set when it stopped at a transactional or control batch. */
static int
batches(PyObject *data, int64_t start, int64_t end, PyObject *decompress, PyObject *records, Keeper *keeper,
        Py_ssize_t *read, int64_t *next_offset, int *transactional)
{
    const unsigned char *bytes = (const unsigned char *)PyBytes_AS_STRING(data);
    Py_ssize_t size = PyBytes_GET_SIZE(data), at = 0;
    *read = 0;
    *next_offset = -1;
    *transactional = 0;
    while (size - at >= 12) {
        const unsigned char *batch = bytes + at;
        int64_t base = be64(batch);
        int32_t length = be32(batch + 8);
        if (length < HEADER_BYTES - 12) {
            PyErr_Format(PyExc_ValueError, "a batch at offset %lld says it holds %d bytes, fewer than its header",
                         (long long)base, (int)length);
            return -1;
        }
        if (size - at - 12 < length) {
            break; /* cut at the fetch's byte limit: the next fetch reads it whole */
        }
        int magic = (signed char)batch[16];
        int attributes = (int16_t)(((unsigned)batch[21] << 8) | batch[22]);
        int32_t last_delta = be32(batch + 23);
        int32_t count = be32(batch + 57);
        if (base < 0 || base > MAX_BASE_OFFSET) {
            PyErr_Format(PyExc_ValueError, "a batch at offset %lld: not an offset this reader takes (0..%lld)",
                         (long long)base, (long long)MAX_BASE_OFFSET);
            return -1;
        }
        if (magic != MAGIC) {
            PyErr_Format(PyExc_ValueError, "a batch at offset %lld of magic %d; this reader reads magic %d",
                         (long long)base, magic, MAGIC);
            return -1;
        }
        if (attributes & (TRANSACTIONAL | CONTROL)) {
            *transactional = 1;
            break;
        }
        if (count < 0 || last_delta < 0) {
            PyErr_Format(PyExc_ValueError, "a batch at offset %lld of %d records, last offset delta %d",
                         (long long)base, (int)count, (int)last_delta);
            return -1;
        }
        const unsigned char *body = batch + HEADER_BYTES;
        Py_ssize_t body_size = 12 + (Py_ssize_t)length - HEADER_BYTES;
        int codec = attributes & CODEC_MASK;
        int done;
        if (codec) {
            PyObject *payload = PyBytes_FromStringAndSize((const char *)body, body_size);
            if (payload == NULL) {
                return -1;
            }
            PyObject *unpacked = PyObject_CallFunction(decompress, "iO", codec, payload);
            Py_DECREF(payload);
            if (unpacked == NULL) {
                return -1;
            }
            if (!PyBytes_CheckExact(unpacked)) {
                PyErr_Format(PyExc_ValueError, "a batch at offset %lld: decompressed to %s, not bytes",
                             (long long)base, Py_TYPE(unpacked)->tp_name);
                Py_DECREF(unpacked);
                return -1;
            }
            /* Held until its records are read: what is taken holds copies of their parts. */
            done = records_of((const unsigned char *)PyBytes_AS_STRING(unpacked), PyBytes_GET_SIZE(unpacked), base,
                              count, start, end, records, keeper, read);
            Py_DECREF(unpacked);
        }
        else {
            done = records_of(body, body_size, base, count, start, end, records, keeper, read);
        }
        if (done < 0) {
            return -1;
        }
        *next_offset = base + last_delta + 1;
        at += 12 + (Py_ssize_t)length;
    }
    return 0;
}

/* read's and read_keep's first four arguments: 0, or -1 with TypeError or ValueError. */
static int
read_arguments(PyObject *const *args, const char *call, int64_t *start, int64_t *end)
{
    if (!PyBytes_CheckExact(args[0]) || !PyLong_CheckExact(args[1]) || !PyLong_CheckExact(args[2])
        || !PyCallable_Check(args[3])) {
        PyErr_Format(PyExc_TypeError, "%s: data must be bytes, start and end ints, decompress a callable", call);
        return -1;
    }
    *start = PyLong_AsLongLong(args[1]);
    *end = PyErr_Occurred() ? 0 : PyLong_AsLongLong(args[2]);
    if (PyErr_Occurred()) {
        PyErr_Format(PyExc_ValueError, "%s: start and end must be int64 offsets", call);
        return -1;
    }
    return 0;
}

static PyObject *
batches_read(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "read(data: bytes, start: int, end: int, decompress: callable)");
        return NULL;
    }
    int64_t start, end, next_offset;
    if (read_arguments(args, "read", &start, &end) < 0) {
        return NULL;
    }
    PyObject *records = PyList_New(0);
    if (records == NULL) {
        return NULL;
    }
    Py_ssize_t read;
    int transactional;
    if (batches(args[0], start, end, args[3], records, NULL, &read, &next_offset, &transactional) < 0) {
        Py_DECREF(records);
        return NULL;
    }
    return Py_BuildValue("(NLO)", records, (long long)next_offset, transactional ? Py_True : Py_False);
}

/* read_keep(data, start, end, decompress, newest, superseded_tombstones, partition, expected, cleaned,
 *           tombstone_prefix, only) -> (records read, next_offset, transactional, expected, cleaned) */
static PyObject *
batches_read_keep(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 11) {
        PyErr_SetString(PyExc_TypeError, "read_keep(data, start, end, decompress, newest, superseded_tombstones, "
                                         "partition, expected, cleaned, tombstone_prefix, only)");
        return NULL;
    }
    int64_t start, end, next_offset;
    Keeper keeper;
    if (read_arguments(args, "read_keep", &start, &end) < 0
        || keeper_of(&keeper, args[4], args[5], args[6], args[7], args[8], args[9], args[10], "read_keep") < 0) {
        return NULL;
    }
    Py_ssize_t read;
    int transactional;
    int done = batches(args[0], start, end, args[3], NULL, &keeper, &read, &next_offset, &transactional);
    keeper_forget(&keeper);
    if (done < 0) {
        return NULL;
    }
    return Py_BuildValue("(nLOLO)", read, (long long)next_offset, transactional ? Py_True : Py_False,
                         keeper.expected, keeper.cleaned ? Py_True : Py_False);
}

/* keep(newest, superseded_tombstones, partition, records, expected, cleaned, tombstone_prefix, only=None)
 *     -> (expected, cleaned)
 *
 * rlmm.record_batches.keep (its reference) in C: the newest record of each key of `records`, consecutive records of
 * one metadata partition, as a rebuild's compacted window keeps them; with `only` = (first, named, name, wanted), only
 * the records whose key's user partition is in `first` (or names none: `in_first`) if `wanted`, else the others. */
static PyObject *
batches_keep(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    Keeper keeper;
    if ((nargs != 7 && nargs != 8) || !PyList_CheckExact(args[3])) {
        PyErr_Format(PyExc_TypeError, "keep(newest, superseded_tombstones, partition, records: list, expected, "
                                      "cleaned, tombstone_prefix, only=None): the others are %s", KEEPER_ARGUMENTS);
        return NULL;
    }
    if (keeper_of(&keeper, args[0], args[1], args[2], args[4], args[5], args[6], nargs == 8 ? args[7] : Py_None,
                  "keep") < 0) {
        return NULL;
    }
    PyObject *records = args[3], *empty = PyBytes_FromStringAndSize(NULL, 0);
    if (empty == NULL) {
        keeper_forget(&keeper);
        return NULL;
    }
    int failed = 0;
    /* The list is read by index each time round: a dict's key comparison or `name` can run Python code. */
    for (Py_ssize_t i = 0; !failed && i < PyList_GET_SIZE(records); i++) {
        PyObject *record = PyList_GET_ITEM(records, i);
        if (!PyTuple_CheckExact(record) || PyTuple_GET_SIZE(record) != 3
            || !PyLong_CheckExact(PyTuple_GET_ITEM(record, 0))) {
            PyErr_Format(PyExc_TypeError, "record %zd: not an (offset, key, value) tuple", i);
            failed = 1;
            break;
        }
        Py_INCREF(record);
        PyObject *offset_object = PyTuple_GET_ITEM(record, 0), *key = PyTuple_GET_ITEM(record, 1);
        PyObject *value = PyTuple_GET_ITEM(record, 2);
        int overflow = 0;
        long long offset = PyLong_AsLongLongAndOverflow(offset_object, &overflow);
        if (overflow || (offset == -1 && PyErr_Occurred()) || offset == LLONG_MAX
            || !(key == Py_None || PyBytes_CheckExact(key)) || !(value == Py_None || PyBytes_CheckExact(value))) {
            PyErr_Clear();
            PyErr_Format(PyExc_TypeError, "record %zd: its offset is not below int64's greatest, or its key or "
                                          "value is neither bytes nor None", i);
            failed = 1;
        }
        else {
            if (key == Py_None) {
                key = empty;
            }
            int wanted = keeper_wants(&keeper, offset, PyBytes_AS_STRING(key), PyBytes_GET_SIZE(key));
            failed = wanted < 0 || (wanted > 0 && keeper_store(&keeper, offset_object, key, value) < 0);
        }
        Py_DECREF(record);
    }
    Py_DECREF(empty);
    keeper_forget(&keeper);
    if (failed) {
        return NULL;
    }
    return Py_BuildValue("(LO)", keeper.expected, keeper.cleaned ? Py_True : Py_False);
}

static PyMethodDef batches_methods[] = {
    {"read", (PyCFunction)(void (*)(void))batches_read, METH_FASTCALL,
     PyDoc_STR("read(data, start, end, decompress) -> (records, next_offset, transactional): the (offset, key, "
               "value) records of a Fetch response's whole batches for one partition")},
    {"keep", (PyCFunction)(void (*)(void))batches_keep, METH_FASTCALL,
     PyDoc_STR("keep(newest, superseded_tombstones, partition, records, expected, cleaned, tombstone_prefix, only=None) -> "
               "(expected, cleaned): the newest record of each key of records, as a compacted window keeps them")},
    {"read_keep", (PyCFunction)(void (*)(void))batches_read_keep, METH_FASTCALL,
     PyDoc_STR("read_keep(data, start, end, decompress, newest, superseded_tombstones, partition, expected, cleaned, "
               "tombstone_prefix, only) -> (read, next_offset, transactional, expected, cleaned): read, then keep, "
               "in one pass")},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef batches_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "rlmm._record_batches",
    .m_doc = PyDoc_STR("Reads Kafka record batches in C (optional; rlmm.record_batches reads them in Python "
                       "without it)."),
    .m_size = -1,
    .m_methods = batches_methods,
};

PyMODINIT_FUNC
PyInit__record_batches(void)
{
    return PyModule_Create(&batches_module);
}
