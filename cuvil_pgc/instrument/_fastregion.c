/* The C accelerator of ProfileRegion's hot path and of the writer's event formatting.
 *
 * Optional: setup.py builds it when a C compiler and Python headers are present; without it
 * (or with CUVIL_PGC_PURE_PYTHON=1) region.py and _eventlines.py run the pure-Python versions,
 * which this file mirrors exactly (tests/test_region_accel.py runs both and compares).
 *
 * What it provides:
 *   RegionBase      base class of ProfileRegion: __enter__/__exit__ and the `_frame` slot.
 *   configure(recorder, sink, sample, current, clock)
 *                   the state regions read: the recorder callable (or None), the session's
 *                   RegionRecorder when it is the only sink (appended to directly, per thread),
 *                   the root-sampling policy (or None), the ContextVar for the per-context
 *                   cursors of the active frame (see Cursor) and
 *                   a replacement clock (None: perf_counter_ns's clock; tests use one).
 *   frame_path(frame) a frame's path, cached on it and its ancestors (filters, aggregates).
 *   current_frame() the innermost active frame of the calling thread / task, or None.
 *   fold_index(frames, index, max_paths)
 *                   path numbers and durations of ended frames, for the aggregate histograms.
 *   format_regions(frames, head, decl_head, s0, floor, names_json, region_json, dumps)
 *                   Chrome "X" event lines for ended frames, and a declaration line for each
 *                   ancestor that has no id yet, as _eventlines.format_regions_py.
 *
 * Frames (the Frame type below) index like the Python version's lists
 * [region, parent, start_ns, id, path, end_ns]. Nothing on the hot path raises into the user's program: errors are cleared and the region is
 * skipped (the Python version cannot fail there either, short of running out of memory).
 *
 * Nothing recurses over the nesting depth (freeing, paths, ids): regions nested a million deep
 * cost what flat ones cost per event. Regions need not nest (interleaved generators, a region
 * ended on another thread): see region.py's docstring for the rules both versions follow.
 *
 * It relies on the GIL (a list append is atomic with respect to the writer's drain), so it is
 * not built for free-threaded Python.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#ifdef Py_GIL_DISABLED
#error "the region accelerator relies on the GIL; free-threaded builds use the pure-Python regions"
#endif

#if PY_VERSION_HEX < 0x030D0000 && !defined(__linux__)
#error "before Python 3.13 the accelerator reads CLOCK_MONOTONIC, which is perf_counter only on Linux"
#endif

static PyObject *g_recorder = NULL;    /* callable(frame, end_ns); NULL: nothing records */
static PyObject *g_sink = NULL;        /* RegionRecorder appended to directly, or NULL */
static PyObject *g_sample = NULL;      /* root sampling policy, or NULL */
static PyObject *g_current = NULL;     /* ContextVar holding each context's Cursor */
static PyObject *g_clock = NULL;       /* a replacement clock (tests); NULL: perf_counter_ns */
static unsigned long long g_sink_serial = 0;
static Py_ssize_t g_sink_capacity = 0;
static long long g_next_id = 1;
static unsigned long long g_epoch = 0;   /* recording epochs: +1 when a recorder follows none */

/* The calling thread's buffer of the configured sink (borrowed: the sink keeps it alive, and it
 * is used only while tls_serial equals the configured sink's serial). */
static _Thread_local unsigned long long tls_serial = 0;
static _Thread_local PyObject *tls_events = NULL;
static _Thread_local PyObject *tls_buffer = NULL;

static PyObject *s_register, *s_events, *s_dropped, *s_slash, *s_empty;

static long long
replaced_clock(void)
{
    PyObject *t = PyObject_CallNoArgs(g_clock);
    long long ns = t == NULL ? -1 : PyLong_AsLongLong(t);
    Py_XDECREF(t);
    if (PyErr_Occurred())
        PyErr_Clear();
    return ns;
}

static inline long long
now_ns(void)
{
    if (g_clock != NULL)
        return replaced_clock();
#if PY_VERSION_HEX >= 0x030D0000
    PyTime_t t;
    (void)PyTime_PerfCounterRaw(&t);
    return (long long)t;
#else
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
#endif
}

/* ---- Frame ------------------------------------------------------------------------------- */

/* One entry of a region. Indexable like the pure-Python frame list
 * [region, parent, start_ns, id, path, end_ns] (None for an unset id, path or end); id and path
 * are assignable (the writer's ids, frame_path's cache).
 *
 * Not a GC object: the thousands of frames waiting in the buffers must cost the garbage
 * collector nothing (as GC objects they triggered and slowed collections: a third of the cost of
 * recording). The one cycle a frame is part of, region._frame -> frame -> region, exists only
 * while the region is active, so a region started and never ended, then dropped, is not freed. */
typedef struct Frame {
    PyObject_HEAD
    PyObject *region;
    struct Frame *parent;      /* NULL for a root */
    PyObject *path;            /* NULL until identified */
    long long start;           /* -1: sampled out */
    long long end;             /* -1 until it ends */
    long long id;              /* 0 until identified */
} Frame;

enum { F_REGION, F_PARENT, F_START, F_ID, F_PATH, F_END, F_SIZE };

static PyTypeObject FrameType;

static inline int
is_frame(PyObject *obj)
{
    return obj != NULL && Py_IS_TYPE(obj, &FrameType);
}

/* Freeing a frame frees the ancestors only it held, in a loop: a chain a million frames deep
 * must not recurse a million C calls deep. */
static void
frame_dealloc(Frame *self)
{
    Frame *parent = self->parent;
    self->parent = NULL;
    Py_XDECREF(self->region);
    Py_XDECREF(self->path);
    PyObject_Free(self);
    while (parent != NULL) {
        if (Py_REFCNT(parent) > 1) {
            Py_DECREF(parent);
            return;
        }
        Frame *next = parent->parent;     /* its reference to `next` passes to us */
        parent->parent = NULL;
        Py_DECREF(parent);
        parent = next;
    }
}

/* The innermost frame at or above `frame` that has not ended (borrowed), or NULL. */
static inline Frame *
live_frame(Frame *frame)
{
    while (frame != NULL && frame->end >= 0)
        frame = frame->parent;
    return frame;
}

static Py_ssize_t
frame_length(PyObject *self)
{
    return F_SIZE;
}

static PyObject *
optional_int(long long value, long long unset)
{
    if (value == unset)
        Py_RETURN_NONE;
    return PyLong_FromLongLong(value);
}

static PyObject *
frame_item(Frame *self, Py_ssize_t i)
{
    switch (i) {
    case F_REGION: return Py_NewRef(self->region);
    case F_PARENT: return Py_NewRef(self->parent ? (PyObject *)self->parent : Py_None);
    case F_START: return PyLong_FromLongLong(self->start);
    case F_ID: return optional_int(self->id, 0);
    case F_PATH: return Py_NewRef(self->path ? self->path : Py_None);
    case F_END: return optional_int(self->end, -1);
    }
    PyErr_SetString(PyExc_IndexError, "frame index out of range");
    return NULL;
}

static int
frame_ass_item(Frame *self, Py_ssize_t i, PyObject *value)
{
    if (i == F_PATH && value != NULL && (value == Py_None || PyUnicode_Check(value))) {
        Py_XSETREF(self->path, value == Py_None ? NULL : Py_NewRef(value));
        return 0;
    }
    if (i == F_ID && value != NULL && (value == Py_None || PyLong_Check(value))) {
        long long id = value == Py_None ? 0 : PyLong_AsLongLong(value);
        if (id == -1 && PyErr_Occurred())
            return -1;
        self->id = id;
        return 0;
    }
    PyErr_SetString(PyExc_TypeError, "only a frame's id (int) and path (str) can be assigned");
    return -1;
}

static PyObject *
frame_repr(Frame *self)
{
    return PyUnicode_FromFormat("<region frame %R start=%lld id=%lld path=%R>", self->region, self->start,
                                self->id, self->path ? self->path : Py_None);
}

static PySequenceMethods frame_as_sequence = {
    .sq_length = frame_length,
    .sq_item = (ssizeargfunc)frame_item,
    .sq_ass_item = (ssizeobjargproc)frame_ass_item,
};

static PyTypeObject FrameType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "cuvil_pgc.instrument._fastregion.Frame",
    .tp_basicsize = sizeof(Frame),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "One entry of a region: [region, parent, start_ns, id, path, end_ns].",
    .tp_dealloc = (destructor)frame_dealloc,
    .tp_repr = (reprfunc)frame_repr,
    .tp_as_sequence = &frame_as_sequence,
};

static Frame *
new_frame(PyObject *region, PyObject *parent, long long start)
{
    Frame *frame = PyObject_New(Frame, &FrameType);
    if (frame == NULL)
        return NULL;
    frame->region = Py_NewRef(region);
    frame->parent = is_frame(parent) ? (Frame *)Py_NewRef(parent) : NULL;
    frame->path = NULL;
    frame->start = start;
    frame->end = -1;
    frame->id = 0;
    return frame;
}

/* ---- Cursor: the innermost active frame of one context ------------------------------------ */

/* Setting a ContextVar costs ~1,100 instructions (a new HAMT node and a token): two per region
 * were a third of what a region cost. So the ContextVar holds a cursor per context instead, set
 * once when a region first runs in that context, and entering and leaving a region move the
 * cursor. A copied context (an asyncio task, copy_context().run) sees its parent's cursor, whose
 * owner is not the current context: it gets a cursor of its own starting at the same frame, so
 * nesting stays correct per thread and per task exactly as with a frame in the ContextVar.
 * The cursor holds its context (owner) strongly: context -> cursor -> context is a cycle the
 * garbage collector frees once the context is gone (cursors are GC objects for that). */
typedef struct {
    PyObject_HEAD
    PyObject *owner;           /* the contextvars.Context this cursor belongs to */
    Frame *current;            /* innermost active frame in that context, or NULL */
    unsigned long long epoch;  /* the recording epoch of `current`: frames of earlier ones are no parents */
} Cursor;

static int
cursor_traverse(Cursor *self, visitproc visit, void *arg)
{
    Py_VISIT(self->owner);
    return 0;
}

static int
cursor_clear(Cursor *self)
{
    Py_CLEAR(self->owner);
    Py_CLEAR(self->current);
    return 0;
}

static void
cursor_dealloc(Cursor *self)
{
    PyObject_GC_UnTrack(self);
    cursor_clear(self);
    PyObject_GC_Del(self);
}

static PyTypeObject CursorType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "cuvil_pgc.instrument._fastregion.Cursor",
    .tp_basicsize = sizeof(Cursor),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "The innermost active region frame of one context.",
    .tp_traverse = (traverseproc)cursor_traverse,
    .tp_clear = (inquiry)cursor_clear,
    .tp_dealloc = (destructor)cursor_dealloc,
};

/* The calling context's cursor (borrowed: the context holds it), created on first use; NULL
 * with an exception set on failure. */
static Cursor *
context_cursor(void)
{
    PyObject *value = NULL;
    if (PyContextVar_Get(g_current, Py_None, &value) < 0)
        return NULL;
    PyObject *context = PyThreadState_GET()->context;
    int is_cursor = Py_IS_TYPE(value, &CursorType);
    if (is_cursor && context != NULL && ((Cursor *)value)->owner == context) {
        Cursor *cursor = (Cursor *)value;
        if (cursor->epoch != g_epoch) {     /* a new session: a clean stack */
            Py_CLEAR(cursor->current);
            cursor->epoch = g_epoch;
        }
        Py_DECREF(value);
        return cursor;
    }
    Cursor *cursor = PyObject_GC_New(Cursor, &CursorType);
    if (cursor == NULL) {
        Py_DECREF(value);
        return NULL;
    }
    cursor->owner = NULL;
    cursor->epoch = g_epoch;
    cursor->current = is_cursor && ((Cursor *)value)->current != NULL && ((Cursor *)value)->epoch == g_epoch
        ? (Frame *)Py_NewRef(((Cursor *)value)->current) : NULL;
    Py_DECREF(value);
    PyObject_GC_Track(cursor);
    PyObject *token = PyContextVar_Set(g_current, (PyObject *)cursor);   /* creates the context if none */
    if (token == NULL) {
        Py_DECREF(cursor);
        return NULL;
    }
    Py_DECREF(token);
    cursor->owner = Py_XNewRef(PyThreadState_GET()->context);
    Py_DECREF(cursor);          /* the context's variables hold it now */
    return cursor;
}

static PyObject *
current_frame(PyObject *module, PyObject *unused)
{
    PyObject *value = NULL;
    if (PyContextVar_Get(g_current, Py_None, &value) < 0)
        return NULL;
    Frame *live = Py_IS_TYPE(value, &CursorType) && ((Cursor *)value)->epoch == g_epoch
        ? live_frame(((Cursor *)value)->current) : NULL;
    PyObject *frame = live != NULL ? (PyObject *)live : Py_None;
    Py_INCREF(frame);
    Py_DECREF(value);
    return frame;
}

/* ---- RegionBase ------------------------------------------------------------------------ */

typedef struct {
    PyObject_HEAD
    PyObject *name;            /* str */
    PyObject *attrs;           /* dict or None */
    PyObject *json;            /* (name, attrs) JSON fragments, cached by the writer; or None */
    PyObject *frame;           /* the latest entry's frame until it exits (None/NULL: none) */
    PyObject *parent_path;     /* child_path's cache: the path under that parent path */
    PyObject *path;
} RegionBase;

static PyObject *g_validate = NULL;   /* region.py's (name, attrs) -> (name, attrs) checks */

/* ProfileRegion(name, **attrs). The usual case, a short ASCII name and no attributes, is
 * accepted here; anything else goes through region.py's checks (which raise RegionError). */
static int
region_init(RegionBase *self, PyObject *args, PyObject *kwargs)
{
    PyObject *name = PyTuple_GET_SIZE(args) == 1 ? PyTuple_GET_ITEM(args, 0) : NULL;
    if (name != NULL && PyUnicode_CheckExact(name) && PyUnicode_IS_ASCII(name)
            && PyUnicode_GET_LENGTH(name) > 0 && PyUnicode_GET_LENGTH(name) <= 65536
            && (kwargs == NULL || PyDict_GET_SIZE(kwargs) == 0)) {
        Py_XSETREF(self->name, Py_NewRef(name));
        Py_XSETREF(self->attrs, Py_NewRef(Py_None));
    }
    else {
        if (g_validate == NULL) {
            PyErr_SetString(PyExc_RuntimeError, "cuvil_pgc.instrument.region did not install its checks");
            return -1;
        }
        PyObject *checked = PyObject_Call(g_validate, args, kwargs);
        if (checked == NULL)
            return -1;
        if (!PyTuple_Check(checked) || PyTuple_GET_SIZE(checked) != 2) {
            Py_DECREF(checked);
            PyErr_SetString(PyExc_TypeError, "the region checks must return (name, attrs)");
            return -1;
        }
        Py_XSETREF(self->name, Py_NewRef(PyTuple_GET_ITEM(checked, 0)));
        Py_XSETREF(self->attrs, Py_NewRef(PyTuple_GET_ITEM(checked, 1)));
        Py_DECREF(checked);
    }
    Py_XSETREF(self->json, Py_NewRef(Py_None));
    Py_XSETREF(self->frame, Py_NewRef(Py_None));
    /* Every class defined in Python is a GC type, ProfileRegion too. One that adds nothing to this
     * struct (no __dict__, no slots) holds nothing the collector could find a cycle through, so
     * its instances are untracked, as CPython untracks tuples and dicts of scalars. */
    if (Py_TYPE(self)->tp_basicsize == sizeof(RegionBase) && Py_TYPE(self)->tp_dictoffset == 0
            && PyObject_GC_IsTracked((PyObject *)self))
        PyObject_GC_UnTrack(self);
    return 0;
}

/* Not a GC object either: what a region references (a str, a dict of scalars, bytes, its
 * non-GC frame) never leads back to it through GC objects, and regions created per call
 * (`with ProfileRegion("step"):`) live on in the buffers until the writer drains them. A Python
 * subclass that adds instance attributes becomes a GC type as usual. */
static void
region_dealloc(RegionBase *self)
{
    Py_CLEAR(self->name);
    Py_CLEAR(self->attrs);
    Py_CLEAR(self->json);
    Py_CLEAR(self->frame);
    Py_CLEAR(self->parent_path);
    Py_CLEAR(self->path);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* Start timestamp of a new frame: -1 when sampled out (a root the policy rejects, or any region
 * under a sampled-out root). */
static long long
sampled_start(PyObject *self, PyObject *parent)
{
    if (g_sample == NULL)
        return now_ns();
    if (!is_frame(parent)) {
        PyObject *keep = PyObject_CallOneArg(g_sample, self);
        int truth = keep == NULL ? 1 : PyObject_IsTrue(keep);
        Py_XDECREF(keep);
        if (truth < 0 || PyErr_Occurred()) {   /* a failing policy keeps the region */
            PyErr_Clear();
            truth = 1;
        }
        return truth ? now_ns() : -1;
    }
    return ((Frame *)parent)->start < 0 ? -1 : now_ns();
}

static PyObject *
region_enter(PyObject *self, PyObject *unused)
{
    if (g_recorder == NULL)
        return Py_NewRef(self);
    Cursor *cursor = context_cursor();
    if (cursor == NULL) {
        PyErr_Clear();
        return Py_NewRef(self);
    }
    Frame *live = live_frame(cursor->current);      /* skip parents that ended out of order */
    PyObject *parent = Py_NewRef(live ? (PyObject *)live : Py_None);
    Frame *frame = new_frame(self, parent, sampled_start(self, parent));
    Py_DECREF(parent);
    if (frame == NULL) {
        PyErr_Clear();
        return Py_NewRef(self);
    }
    Py_XSETREF(cursor->current, (Frame *)Py_NewRef(frame));
    Py_XSETREF(((RegionBase *)self)->frame, (PyObject *)frame);    /* steals the reference */
    return Py_NewRef(self);
}

/* Append an ended frame to the calling thread's buffer of the configured sink. */
static void
append_to_sink(PyObject *frame)
{
    if (tls_serial != g_sink_serial) {
        PyObject *buffer = PyObject_CallMethodNoArgs(g_sink, s_register);
        PyObject *events = buffer == NULL ? NULL : PyObject_GetAttr(buffer, s_events);
        if (events == NULL || !PyList_CheckExact(events)) {
            Py_XDECREF(buffer);
            Py_XDECREF(events);
            PyErr_Clear();
            return;
        }
        tls_buffer = buffer;    /* borrowed from here on: the sink's buffer list holds both */
        tls_events = events;
        Py_DECREF(events);
        Py_DECREF(buffer);
        tls_serial = g_sink_serial;
    }
    if (PyList_GET_SIZE(tls_events) < g_sink_capacity) {
        if (PyList_Append(tls_events, frame) < 0)
            PyErr_Clear();
        return;
    }
    PyObject *dropped = PyObject_GetAttr(tls_buffer, s_dropped);
    PyObject *one = PyLong_FromLong(1);
    PyObject *more = dropped == NULL || one == NULL ? NULL : PyNumber_Add(dropped, one);
    if (more == NULL || PyObject_SetAttr(tls_buffer, s_dropped, more) < 0)
        PyErr_Clear();
    Py_XDECREF(dropped);
    Py_XDECREF(one);
    Py_XDECREF(more);
}

static void
deliver(PyObject *frame, long long end)
{
    if (g_sink != NULL) {
        append_to_sink(frame);
        return;
    }
    PyObject *end_obj = PyLong_FromLongLong(end);
    if (end_obj == NULL) {
        PyErr_Clear();
        return;
    }
    PyObject *args[2] = {frame, end_obj};
    PyObject *recorder = Py_NewRef(g_recorder);   /* a sink may reconfigure while it runs */
    PyObject *result = PyObject_Vectorcall(recorder, args, 2, NULL);
    Py_DECREF(recorder);
    Py_DECREF(end_obj);
    if (result == NULL)
        PyErr_Clear();
    Py_XDECREF(result);
}

#define ADOPT_LIMIT 32   /* region.py's ADOPT_LIMIT */

/* `ended` ended out of order: a region started inside it that still runs (on the active chain
 * from `top`) becomes a child of `ended`'s parent, so no region outlives its parent. */
static void
adopt(Frame *top, Frame *ended)
{
    for (int i = 0; i < ADOPT_LIMIT && top != NULL; i++) {
        Frame *parent = top->parent;
        if (parent == ended) {
            if (top->end < 0) {
                top->parent = ended->parent ? (Frame *)Py_NewRef(ended->parent) : NULL;
                Py_CLEAR(top->path);
                Py_DECREF(ended);          /* top's reference; `ended` is still held by our caller */
            }
            return;
        }
        top = parent;
    }
}

static PyObject *
region_exit(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    RegionBase *region = (RegionBase *)self;
    PyObject *own = is_frame(region->frame) ? region->frame : NULL;   /* `_frame` may hold None */
    if (g_recorder == NULL && own == NULL)
        Py_RETURN_NONE;
    long long end = now_ns();
    Cursor *cursor = context_cursor();
    if (cursor == NULL)
        PyErr_Clear();
    Frame *frame;
    Frame *top = cursor != NULL ? live_frame(cursor->current) : NULL;
    if (top != NULL && top->region == self) {
        frame = (Frame *)Py_NewRef(top);
        Frame *next = live_frame(top->parent);
        Py_XSETREF(cursor->current, next ? (Frame *)Py_NewRef(next) : NULL);
    }
    else {   /* ended out of order (interleaved generators) or from another context or thread */
        if (own == NULL)
            Py_RETURN_NONE;
        frame = (Frame *)Py_NewRef(own);
        if (cursor != NULL)
            adopt(cursor->current, frame);
    }
    Py_CLEAR(region->frame);
    if (frame->end < 0) {
        frame->end = end;
        if (g_recorder != NULL && frame->start >= 0)
            deliver((PyObject *)frame, end);
    }
    if (PyErr_Occurred())
        PyErr_Clear();
    Py_DECREF(frame);
    Py_RETURN_NONE;
}

static PyMethodDef region_methods[] = {
    {"__enter__", (PyCFunction)region_enter, METH_NOARGS, "Begin the region (records while a session is active)."},
    {"__exit__", (PyCFunction)(void (*)(void))region_exit, METH_FASTCALL, "End the region."},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef region_members[] = {
    {"name", T_OBJECT_EX, offsetof(RegionBase, name), 0, "the region's name"},
    {"attrs", T_OBJECT_EX, offsetof(RegionBase, attrs), 0, "static attributes (dict) or None"},
    {"_json", T_OBJECT_EX, offsetof(RegionBase, json), 0, "(name, attrs) JSON fragments (writer's cache) or None"},
    {"_frame", T_OBJECT, offsetof(RegionBase, frame), 0, "the frame of the latest entry, until it exits"},
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject RegionBaseType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "cuvil_pgc.instrument._fastregion.RegionBase",
    .tp_basicsize = sizeof(RegionBase),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .tp_doc = "Construction, enter and exit of ProfileRegion in C.",
    .tp_dealloc = (destructor)region_dealloc,
    .tp_methods = region_methods,
    .tp_members = region_members,
    .tp_init = (initproc)region_init,
    .tp_new = PyType_GenericNew,
};

/* ---- configure --------------------------------------------------------------------------- */

static PyObject *
configure(PyObject *module, PyObject *args)
{
    PyObject *recorder, *sink, *sample, *current, *clock;
    if (!PyArg_ParseTuple(args, "OOOOO:configure", &recorder, &sink, &sample, &current, &clock))
        return NULL;
    Py_ssize_t capacity = 0;
    unsigned long long serial = 0;
    if (sink != Py_None) {
        PyObject *cap = PyObject_GetAttrString(sink, "capacity");
        PyObject *ser = cap == NULL ? NULL : PyObject_GetAttrString(sink, "serial");
        capacity = cap == NULL ? -1 : PyLong_AsSsize_t(cap);
        serial = ser == NULL ? 0 : PyLong_AsUnsignedLongLong(ser);
        Py_XDECREF(cap);
        Py_XDECREF(ser);
        if (PyErr_Occurred())
            return NULL;
        if (serial == 0) {
            PyErr_SetString(PyExc_ValueError, "a sink's serial must be a positive int");
            return NULL;
        }
    }
    if (g_recorder == NULL && recorder != Py_None)
        g_epoch++;
    Py_XSETREF(g_recorder, recorder == Py_None ? NULL : Py_NewRef(recorder));
    Py_XSETREF(g_sink, sink == Py_None ? NULL : Py_NewRef(sink));
    Py_XSETREF(g_sample, sample == Py_None ? NULL : Py_NewRef(sample));
    Py_XSETREF(g_current, Py_NewRef(current));
    Py_XSETREF(g_clock, clock == Py_None ? NULL : Py_NewRef(clock));
    g_sink_capacity = capacity;
    g_sink_serial = serial;
    Py_RETURN_NONE;
}

static PyObject *
set_checks(PyObject *module, PyObject *fn)
{
    Py_XSETREF(g_validate, Py_NewRef(fn));
    Py_RETURN_NONE;
}

/* ---- paths ------------------------------------------------------------------------------- */

/* The path of `region` under `parent_path`, from the region's one-entry cache when the parent
 * path is the same string object as last time (usual: parents' paths come from the same caches),
 * so repeated regions share one path string. */
static PyObject *
child_path(PyObject *region, PyObject *parent_path)
{
    RegionBase *base = (RegionBase *)region;
    if (base->path != NULL && base->parent_path == parent_path)
        return Py_NewRef(base->path);
    PyObject *name = base->name;
    if (name == NULL || !PyUnicode_Check(name)) {
        PyErr_SetString(PyExc_TypeError, "a region's name must be a str");
        return NULL;
    }
    Py_INCREF(name);
    PyObject *path = name;
    if (parent_path != NULL) {
        PyObject *head = PyUnicode_Concat(parent_path, s_slash);
        path = head == NULL ? NULL : PyUnicode_Concat(head, name);
        Py_XDECREF(head);
        Py_DECREF(name);
        if (path == NULL)
            return NULL;
    }
    Py_XSETREF(base->parent_path, Py_XNewRef(parent_path));
    Py_XSETREF(base->path, Py_NewRef(path));
    return path;
}

/* A growable list of strong frame references (chains of ancestors, walked without recursion). */
typedef struct {
    Frame **items;
    Py_ssize_t n, cap;
    Frame *inline_items[32];
} FrameStack;

static void
stack_init(FrameStack *st)
{
    st->items = st->inline_items;
    st->n = 0;
    st->cap = 32;
}

static int
stack_push(FrameStack *st, Frame *frame)
{
    if (st->n == st->cap) {
        Py_ssize_t cap = st->cap * 2;
        Frame **items = st->items == st->inline_items ? PyMem_Malloc(cap * sizeof(Frame *))
                                                      : PyMem_Realloc(st->items, cap * sizeof(Frame *));
        if (items == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        if (st->items == st->inline_items)
            memcpy(items, st->inline_items, sizeof(st->inline_items));
        st->items = items;
        st->cap = cap;
    }
    st->items[st->n++] = (Frame *)Py_NewRef(frame);
    return 0;
}

static void
stack_free(FrameStack *st)
{
    for (Py_ssize_t i = 0; i < st->n; i++)
        Py_DECREF(st->items[i]);
    if (st->items != st->inline_items)
        PyMem_Free(st->items);
}

/* A frame's path, cached on it and on each ancestor that had none (borrowed; NULL on error).
 * Built from the nearest ancestor with a path down, in a loop. */
static PyObject *
path_of(Frame *frame)
{
    if (frame->path != NULL)
        return frame->path;
    FrameStack chain;
    stack_init(&chain);
    Frame *f = frame;
    for (; f != NULL && f->path == NULL; f = f->parent) {
        if (stack_push(&chain, f) < 0) {
            stack_free(&chain);
            return NULL;
        }
    }
    PyObject *parent_path = f != NULL ? f->path : NULL;
    for (Py_ssize_t i = chain.n - 1; i >= 0; i--) {
        Frame *c = chain.items[i];
        if (c->path == NULL) {
            PyObject *path = child_path(c->region, parent_path);
            if (path == NULL)
                break;
            c->path = path;
        }
        parent_path = c->path;
    }
    stack_free(&chain);
    return frame->path;
}

static PyObject *
frame_path(PyObject *module, PyObject *frame)
{
    if (!is_frame(frame)) {
        PyErr_Format(PyExc_TypeError, "frame_path() takes a region frame, not %.80s", Py_TYPE(frame)->tp_name);
        return NULL;
    }
    PyObject *path = path_of((Frame *)frame);
    return Py_XNewRef(path);
}

/* ---- fold_index -------------------------------------------------------------------------- */

/* fold_index(frames, index, max_paths) -> (indices, durations): two native int64 arrays as bytes.
 * indices[i] is frames[i]'s path's number in `index` (path -> int, grown here while it has fewer
 * than max_paths entries; -1 for a path that did not fit), durations[i] its end - start in ns. */
static PyObject *
fold_index(PyObject *module, PyObject *args)
{
    PyObject *frames, *index;
    Py_ssize_t max_paths;
    if (!PyArg_ParseTuple(args, "O!O!n:fold_index", &PyList_Type, &frames, &PyDict_Type, &index, &max_paths))
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(frames);
    PyObject *indices = PyBytes_FromStringAndSize(NULL, n * 8);
    PyObject *durations = PyBytes_FromStringAndSize(NULL, n * 8);
    if (indices == NULL || durations == NULL)
        goto fail;
    long long *idx = (long long *)PyBytes_AS_STRING(indices), *dur = (long long *)PyBytes_AS_STRING(durations);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *obj = PyList_GET_ITEM(frames, i);
        if (!is_frame(obj) || ((Frame *)obj)->end < 0) {
            PyErr_SetString(PyExc_TypeError, "fold_index() takes ended region frames");
            goto fail;
        }
        Frame *frame = (Frame *)obj;
        PyObject *path = path_of(frame);
        if (path == NULL)
            goto fail;
        PyObject *number = PyDict_GetItemWithError(index, path);
        if (number != NULL) {
            idx[i] = PyLong_AsLongLong(number);
        }
        else if (PyErr_Occurred()) {
            goto fail;
        }
        else if (PyDict_GET_SIZE(index) < max_paths) {
            idx[i] = PyDict_GET_SIZE(index);
            number = PyLong_FromLongLong(idx[i]);
            if (number == NULL || PyDict_SetItem(index, path, number) < 0) {
                Py_XDECREF(number);
                goto fail;
            }
            Py_DECREF(number);
        }
        else {
            idx[i] = -1;
        }
        dur[i] = frame->end - frame->start;
    }
    return Py_BuildValue("(NN)", indices, durations);
fail:
    Py_XDECREF(indices);
    Py_XDECREF(durations);
    return NULL;
}

/* ---- format_regions ---------------------------------------------------------------------- */

/* The output: a bytes object written in place and shrunk at the end (no copy of the text). */
typedef struct {
    PyObject *bytes;
    size_t len, cap;
} Out;

static int
out_reserve(Out *out, size_t more)
{
    if (out->len + more <= out->cap)
        return 0;
    size_t cap = out->cap ? out->cap : 4096;
    while (cap < out->len + more)
        cap *= 2;
    if (out->bytes == NULL ? (out->bytes = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)cap)) == NULL
                           : _PyBytes_Resize(&out->bytes, (Py_ssize_t)cap) < 0)
        return -1;
    out->cap = cap;
    return 0;
}

static inline void
put(Out *out, const char *s, size_t n)
{
    memcpy(PyBytes_AS_STRING(out->bytes) + out->len, s, n);
    out->len += n;
}

static inline void
put_uint(Out *out, unsigned long long v)
{
    char tmp[24];
    int i = 24;
    do {
        tmp[--i] = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    put(out, tmp + i, 24 - i);
}

/* ns as JSON microseconds, the text Python's float repr gives for ns / 1000 (trailing zeros of
 * the fraction dropped, at least one digit after the point). */
static inline void
put_us(Out *out, long long ns)
{
    unsigned long long v = ns < 0 ? (unsigned long long)(-(ns + 1)) + 1 : (unsigned long long)ns;
    if (ns < 0)
        put(out, "-", 1);
    put_uint(out, v / 1000);
    unsigned frac = (unsigned)(v % 1000);
    char digits[4] = {'.', (char)('0' + frac / 100), (char)('0' + frac / 10 % 10), (char)('0' + frac % 10)};
    size_t n = frac == 0 ? 2 : frac % 10 ? 4 : frac % 100 ? 3 : 2;
    put(out, digits, n);
}

static int
put_bytes(Out *out, PyObject *obj)
{
    if (!PyBytes_Check(obj)) {
        PyErr_Format(PyExc_TypeError, "expected bytes, got %.80s", Py_TYPE(obj)->tp_name);
        return -1;
    }
    Py_ssize_t n = PyBytes_GET_SIZE(obj);
    if (out_reserve(out, (size_t)n) < 0)
        return -1;
    put(out, PyBytes_AS_STRING(obj), (size_t)n);
    return 0;
}

/* JSON text of a str, from the writer's cache (names_json: str -> bytes). */
static PyObject *
str_fragment(PyObject *text, PyObject *cache, PyObject *dumps)
{
    PyObject *cached = PyDict_GetItemWithError(cache, text);
    if (cached != NULL)
        return Py_NewRef(cached);
    if (PyErr_Occurred())
        return NULL;
    PyObject *json = PyObject_CallOneArg(dumps, text);
    if (json != NULL && PyDict_SetItem(cache, text, json) < 0)
        Py_CLEAR(json);
    return json;
}

/* A region's name and attributes as JSON fragments (new references): its cached `_json`; for a
 * region without attributes the name's JSON from the str cache (regions created per call share
 * it); else region_json(region), which caches `_json`. */
static int
region_fragments(PyObject *region, PyObject *region_json, PyObject *cache, PyObject *dumps,
                 PyObject **name_json, PyObject **attrs_json)
{
    RegionBase *base = (RegionBase *)region;
    PyObject *pair = base->json;
    if ((pair == NULL || pair == Py_None) && (base->attrs == NULL || base->attrs == Py_None)
            && base->name != NULL && PyUnicode_CheckExact(base->name)) {
        *name_json = str_fragment(base->name, cache, dumps);
        *attrs_json = Py_NewRef(s_empty);
        return *name_json == NULL ? -1 : 0;
    }
    pair = pair != NULL && pair != Py_None ? Py_NewRef(pair) : PyObject_CallOneArg(region_json, region);
    if (pair == NULL)
        return -1;
    if (!PyTuple_Check(pair) || PyTuple_GET_SIZE(pair) != 2) {
        Py_DECREF(pair);
        PyErr_SetString(PyExc_TypeError, "region_json must give (name_json, attrs_json)");
        return -1;
    }
    *name_json = Py_NewRef(PyTuple_GET_ITEM(pair, 0));
    *attrs_json = Py_NewRef(PyTuple_GET_ITEM(pair, 1));
    Py_DECREF(pair);
    return 0;
}

/* `,"parent":N` or `,"parent":null`. */
static void
put_parent(Out *out, Frame *parent)
{
    put(out, ",\"parent\":", 10);
    if (parent == NULL)
        put(out, "null", 4);
    else
        put_uint(out, (unsigned long long)parent->id);
}

/* Give `frame` and each ancestor without an id an id, and write one declaration line for each
 * ({"ph":"M","name":"cuvil_region",...,"args":{"name":...,"id":N,"parent":P}}): the reader
 * rebuilds paths from ids, and these are regions still open (or written later, or dropped),
 * whose children are written now. Ancestors get ids before any line names them. */
static int
declare(Out *out, Frame *frame, long long floor, PyObject *decl_head, PyObject *names_json,
        PyObject *region_json, PyObject *dumps)
{
    FrameStack chain;
    stack_init(&chain);
    int rc = -1;
    for (Frame *f = frame; f != NULL && f->id < floor; f = f->parent) {
        if (stack_push(&chain, f) < 0)
            goto done;
        f->id = g_next_id++;
    }
    for (Py_ssize_t i = 0; i < chain.n; i++) {
        Frame *f = chain.items[i];
        PyObject *name_json = NULL, *attrs_json = NULL;
        if (region_fragments(f->region, region_json, names_json, dumps, &name_json, &attrs_json) < 0)
            goto done;
        int bad = put_bytes(out, decl_head) < 0 || put_bytes(out, name_json) < 0 || out_reserve(out, 64) < 0;
        Py_DECREF(name_json);
        Py_DECREF(attrs_json);
        if (bad)
            goto done;
        Frame *parent = f->parent;   /* read once: a region ending elsewhere may re-parent f */
        if (parent != NULL && parent->id < floor) {
            if (stack_push(&chain, parent) < 0)
                goto done;
            parent->id = g_next_id++;
        }
        put(out, ",\"id\":", 6);
        put_uint(out, (unsigned long long)f->id);
        put_parent(out, parent);
        put(out, "}},\n", 4);
    }
    rc = 0;
done:
    stack_free(&chain);
    return rc;
}

static int
format_one(Out *out, PyObject *obj, PyObject *head, PyObject *decl_head, long long s0, long long floor,
           PyObject *names_json, PyObject *region_json, PyObject *dumps)
{
    Frame *frame = (Frame *)obj;
    PyObject *name_json = NULL, *attrs_json = NULL;
    Frame *parent = NULL;
    int rc = -1;
    if (region_fragments(frame->region, region_json, names_json, dumps, &name_json, &attrs_json) < 0)
        goto done;
    parent = frame->parent ? (Frame *)Py_NewRef(frame->parent) : NULL;   /* after Python code ran */
    if (parent != NULL && parent->id < floor
            && declare(out, parent, floor, decl_head, names_json, region_json, dumps) < 0)
        goto done;
    if (put_bytes(out, head) < 0 || put_bytes(out, name_json) < 0 || out_reserve(out, 160) < 0)
        goto done;
    put(out, ",\"ts\":", 6);
    put_us(out, frame->start - s0);
    put(out, ",\"dur\":", 7);
    put_us(out, frame->end - frame->start);
    put(out, ",\"args\":{\"id\":", 14);
    put_uint(out, (unsigned long long)frame->id);
    put_parent(out, parent);
    if (put_bytes(out, attrs_json) < 0 || out_reserve(out, 4) < 0)
        goto done;
    put(out, "}},\n", 4);
    rc = 0;
done:
    Py_XDECREF(parent);
    Py_XDECREF(name_json);
    Py_XDECREF(attrs_json);
    return rc;
}

/* format_regions(frames, head, decl_head, s0, floor, names_json, region_json, dumps) -> bytes.
 * Every frame of the batch gets its id first, so only ancestors outside the batch are declared.
 * Ids below `floor` (the session's first id, reserve_id()) were given by an earlier session, in
 * another file: such frames (a region open across capture windows) get a new id, in this file. */
static PyObject *
format_regions(PyObject *module, PyObject *args)
{
    PyObject *frames, *head, *decl_head, *names_json, *region_json, *dumps;
    long long s0, floor;
    if (!PyArg_ParseTuple(args, "O!SSLLO!OO:format_regions", &PyList_Type, &frames, &head, &decl_head, &s0,
                          &floor, &PyDict_Type, &names_json, &region_json, &dumps))
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(frames);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *obj = PyList_GET_ITEM(frames, i);
        if (!is_frame(obj) || ((Frame *)obj)->end < 0) {
            PyErr_SetString(PyExc_TypeError, "format_regions() takes ended region frames");
            return NULL;
        }
        if (((Frame *)obj)->id < floor)
            ((Frame *)obj)->id = g_next_id++;
    }
    Out out = {NULL, 0, 0};
    if (out_reserve(&out, (size_t)(n + 1) * (size_t)(PyBytes_GET_SIZE(head) + 128)) < 0)
        return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *frame = Py_NewRef(PyList_GET_ITEM(frames, i));
        int rc = format_one(&out, frame, head, decl_head, s0, floor, names_json, region_json, dumps);
        Py_DECREF(frame);
        if (rc < 0) {
            Py_DECREF(out.bytes);
            return NULL;
        }
    }
    if (_PyBytes_Resize(&out.bytes, (Py_ssize_t)out.len) < 0)
        return NULL;
    return out.bytes;
}

static PyObject *
reserve_id(PyObject *module, PyObject *unused)
{
    return PyLong_FromLongLong(g_next_id++);
}

/* ---- module ------------------------------------------------------------------------------ */

static PyMethodDef module_methods[] = {
    {"configure", configure, METH_VARARGS, "configure(recorder, sink, sample, current, clock): what regions read."},
    {"set_checks", set_checks, METH_O, "set_checks(fn): (name, **attrs) -> (name, attrs), raising on bad input."},
    {"fold_index", fold_index, METH_VARARGS,
     "fold_index(frames, index, max_paths) -> (int64 path numbers, int64 durations) as bytes."},
    {"current_frame", current_frame, METH_NOARGS, "The innermost active frame of this context, or None."},
    {"frame_path", frame_path, METH_O, "A frame's path, cached on it and its ancestors."},
    {"format_regions", format_regions, METH_VARARGS,
     "format_regions(frames, head, decl_head, s0, floor, names_json, region_json, dumps) -> bytes of event lines."},
    {"reserve_id", reserve_id, METH_NOARGS, "A region id no frame has: a session's id floor."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef fastregion_module = {
    PyModuleDef_HEAD_INIT, "_fastregion", "C accelerator of ProfileRegion (see _fastregion.c).", -1,
    module_methods,
};

PyMODINIT_FUNC
PyInit__fastregion(void)
{
    if (PyType_Ready(&FrameType) < 0 || PyType_Ready(&CursorType) < 0 || PyType_Ready(&RegionBaseType) < 0)
        return NULL;
    s_register = PyUnicode_InternFromString("_register");
    s_events = PyUnicode_InternFromString("events");
    s_dropped = PyUnicode_InternFromString("dropped");
    s_slash = PyUnicode_InternFromString("/");
    s_empty = PyBytes_FromStringAndSize("", 0);
    if (!s_register || !s_events || !s_dropped || !s_slash || !s_empty)
        return NULL;
    PyObject *module = PyModule_Create(&fastregion_module);
    if (module == NULL)
        return NULL;
    if (PyModule_AddObjectRef(module, "RegionBase", (PyObject *)&RegionBaseType) < 0
            || PyModule_AddObjectRef(module, "Frame", (PyObject *)&FrameType) < 0
            || PyModule_AddObjectRef(module, "Cursor", (PyObject *)&CursorType) < 0) {
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
