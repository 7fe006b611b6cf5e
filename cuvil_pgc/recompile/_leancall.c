/* A built region's lean call in C: cuvil_pgc.recompile.lean_call.
 *
 * lean_call(region, lean, positional) -> the region's output, or the MISFIT marker
 * lean_arrays(positional, checks, ids, tensor_type, value_marker) -> list of NumPy arrays, or None
 * model_output(recipe, outputs) -> a Hugging Face ModelOutput around the runtime's outputs
 * ids_fit(values, ids) -> whether every id input among the arrays or CPU tensors is in range
 * keyword_positions(args, kwargs, names, fills, extras) -> a keyword call as a positional one, or None
 *
 * Between a runtime's inferences every line of Python runs on cold caches: in one process,
 * interleaved, the Python checks of the zoo's tiny BERT (one id input, OpenVINO) cost 17-21 µs
 * over the bare array call and these 2-4 µs; the Python gate around them and the ModelOutput a
 * Hugging Face BERT returns, 6 µs each of its 0.37 ms call. The semantics are the Python version's,
 * which lean_call.py holds and the tests compare this one with; any error in the checks is a
 * misfit: the region's checked path runs the call and raises what it must. An error of the runtime
 * or of the output's rebuild propagates, as in Python.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

static PyObject *s_shape, *s_dtype, *s_is_contiguous, *s_numpy, *s_next_id, *s_quiet_at, *s_quiet, *s_training;

/* what configure() hands over once: torch.Tensor, the VALUE and MISFIT markers, torch's hook
 * handle class, the autocast and tracing tests, and flat_leaves (see lean_call.py) */
static PyObject *c_tensor_type, *c_marker, *c_misfit, *c_handles, *c_autocast, *c_tracing, *c_flat_leaves;

/* 1 where a function called as `usage` got its `wanted` arguments; else 0, with a TypeError set. */
static int
takes(Py_ssize_t nargs, Py_ssize_t wanted, const char *usage)
{
    if (nargs == wanted)
        return 1;
    PyErr_Format(PyExc_TypeError, "%s takes %zd arguments", usage, wanted);
    return 0;
}

/* 1 where every id of `array` (its values viewed as unsigned: a negative one is huge) is below
 * `rows`, or below its element of `limit` (a C-contiguous array of the same item size and length);
 * 0 where one is not; -1 with an exception set on anything else. */
static int
ids_in_range(PyObject *array, PyObject *rows, PyObject *limit)
{
    Py_buffer ids, lim;
    int ok = 1;
    if (PyObject_GetBuffer(array, &ids, PyBUF_C_CONTIGUOUS) < 0)
        return -1;
    Py_ssize_t n = ids.len / ids.itemsize;
    if (ids.itemsize != 8 && ids.itemsize != 4) {
        PyErr_SetString(PyExc_TypeError, "ids must be 4- or 8-byte integers");
        ok = -1;
    }
    else if (limit == Py_None) {
        unsigned long long bound = PyLong_AsUnsignedLongLong(rows);
        if (bound == (unsigned long long)-1 && PyErr_Occurred())
            ok = -1;
        else if (ids.itemsize == 8) {
            const uint64_t *p = ids.buf;
            uint64_t top = 0;
            for (Py_ssize_t i = 0; i < n; i++)
                top = p[i] > top ? p[i] : top;
            ok = n == 0 || top < bound;
        }
        else {
            const uint32_t *p = ids.buf;
            uint32_t top = 0;
            for (Py_ssize_t i = 0; i < n; i++)
                top = p[i] > top ? p[i] : top;
            ok = n == 0 || (unsigned long long)top < bound;
        }
    }
    else if (PyObject_GetBuffer(limit, &lim, PyBUF_C_CONTIGUOUS) < 0)
        ok = -1;
    else {
        if (lim.len != ids.len || lim.itemsize != ids.itemsize) {
            PyErr_SetString(PyExc_ValueError, "an id limit must match its input");
            ok = -1;
        }
        else if (ids.itemsize == 8) {
            const uint64_t *p = ids.buf, *q = lim.buf;
            for (Py_ssize_t i = 0; i < n && ok; i++)
                ok = p[i] < q[i];
        }
        else {
            const uint32_t *p = ids.buf, *q = lim.buf;
            for (Py_ssize_t i = 0; i < n && ok; i++)
                ok = p[i] < q[i];
        }
        PyBuffer_Release(&lim);
    }
    PyBuffer_Release(&ids);
    return ok;
}

/* 1 where every id input of `ids` ((position, unsigned dtype, rows, element-wise limit or None)
 * each) among `values` (NumPy arrays, or torch tensors in CPU memory: viewed as arrays) is in
 * range (see ids_in_range), 0 where one is not, -1 with an exception set on anything else. */
static int
all_ids_in_range(PyObject *values, PyObject *ids)
{
    PyObject *fast = PySequence_Fast(ids, "ids must be a sequence");
    if (fast == NULL)
        return -1;
    int ok = 1;
    for (Py_ssize_t k = 0; k < PySequence_Fast_GET_SIZE(fast) && ok == 1; k++) {
        PyObject *id = PySequence_Fast_GET_ITEM(fast, k);
        if (!PyTuple_Check(id) || PyTuple_GET_SIZE(id) != 4) {
            PyErr_SetString(PyExc_TypeError, "an id check is (position, unsigned dtype, rows, limit)");
            ok = -1;
            break;
        }
        Py_ssize_t at = PyLong_AsSsize_t(PyTuple_GET_ITEM(id, 0));
        if (at < 0) {                   /* (PySequence_GetItem would count a negative one from the end) */
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_IndexError, "an id check's position is negative");
            ok = -1;
            break;
        }
        PyObject *value = PySequence_GetItem(values, at), *array;
        if (value == NULL) {
            ok = -1;
            break;
        }
        array = c_tensor_type != NULL && (PyObject *)Py_TYPE(value) == c_tensor_type
                ? PyObject_CallMethodNoArgs(value, s_numpy) : Py_NewRef(value);
        Py_DECREF(value);
        if (array == NULL) {
            ok = -1;
            break;
        }
        ok = ids_in_range(array, PyTuple_GET_ITEM(id, 2), PyTuple_GET_ITEM(id, 3));
        Py_DECREF(array);
    }
    Py_DECREF(fast);
    return ok;
}

#define FREE_NAMES 16      /* the most named sizes a free shape may have (lean_call.py: FREE_NAMES) */

/* 1 where the sizes `s` (a torch.Size) fit the free shape `shape` (a list: per dimension its size,
 * or (name, smallest, largest), the name an index below FREE_NAMES whose size `named` holds once
 * a dimension set it, -1 before), else 0; a size that is not an int fits nothing. */
static int
fits_free(PyObject *s, PyObject *shape, long long *named)
{
    Py_ssize_t n = PyList_GET_SIZE(shape);
    if (!PyTuple_Check(s) || PyTuple_GET_SIZE(s) != n)
        return 0;
    for (Py_ssize_t j = 0; j < n; j++) {
        PyObject *size = PyTuple_GET_ITEM(s, j), *dim = PyList_GET_ITEM(shape, j);
        if (!PyLong_CheckExact(size))
            return 0;
        long long v = PyLong_AsLongLong(size);
        if (PyLong_CheckExact(dim)) {
            if (v != PyLong_AsLongLong(dim))
                return 0;
            continue;
        }
        if (!PyTuple_Check(dim) || PyTuple_GET_SIZE(dim) != 3)
            return 0;
        long long k = PyLong_AsLongLong(PyTuple_GET_ITEM(dim, 0)), lo = PyLong_AsLongLong(PyTuple_GET_ITEM(dim, 1)),
                  hi = PyLong_AsLongLong(PyTuple_GET_ITEM(dim, 2));
        if (PyErr_Occurred() || k < 0 || k >= FREE_NAMES || v < lo || v > hi || (named[k] >= 0 && named[k] != v))
            return 0;
        named[k] = v;
    }
    return !PyErr_Occurred();
}

/* The array of tensor `a` captured as (shape, dtype): a new reference, or NULL (a mismatch, with
 * any exception cleared). A size that is not an int means torch.jit's tracer hands them out (it
 * records the call; it must not run): a mismatch too. A shape that is a list is free (fits_free). */
static PyObject *
tensor_array(PyObject *a, PyObject *shape, PyObject *dtype, PyObject *tensor_type, long long *named)
{
    if ((PyObject *)Py_TYPE(a) != tensor_type)
        return NULL;
    PyObject *s = PyObject_GetAttr(a, s_shape);
    if (s == NULL)
        goto fail;
    int same = PyList_Check(shape) ? fits_free(s, shape, named)
               : PyTuple_Check(s) && (PyTuple_GET_SIZE(s) == 0 || PyLong_CheckExact(PyTuple_GET_ITEM(s, 0)))
               ? PyObject_RichCompareBool(s, shape, Py_EQ) : 0;
    Py_DECREF(s);
    if (same != 1)
        goto fail;
    PyObject *d = PyObject_GetAttr(a, s_dtype);
    if (d == NULL)
        goto fail;
    same = d == dtype;              /* torch's dtypes are singletons: compared by identity */
    Py_DECREF(d);
    if (!same)
        return NULL;
    PyObject *c = PyObject_CallMethodNoArgs(a, s_is_contiguous);
    if (c == NULL)
        goto fail;
    same = c == Py_True;
    Py_DECREF(c);
    if (!same)
        return NULL;
    PyObject *array = PyObject_CallMethodNoArgs(a, s_numpy);   /* refuses grad and other devices */
    if (array != NULL)
        return array;
fail:
    PyErr_Clear();
    return NULL;
}

/* The arrays of `positional` where it fits `checks` and `ids` (see lean_call.py: python_lean_arrays),
 * or None; never an exception. */
static PyObject *
checked_arrays(PyObject *positional_in, PyObject *checks_in, PyObject *ids_in, PyObject *tensor_type, PyObject *marker)
{
    PyObject *positional = NULL, *checks = NULL, *ids = NULL, *arrays = NULL;
    if ((positional = PySequence_Fast(positional_in, "")) == NULL || (checks = PySequence_Fast(checks_in, "")) == NULL
            || (ids = PySequence_Fast(ids_in, "")) == NULL || (arrays = PyList_New(0)) == NULL)
        goto mismatch;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(positional);
    if (n != PySequence_Fast_GET_SIZE(checks))
        goto mismatch;
    long long named[FREE_NAMES];
    for (int k = 0; k < FREE_NAMES; k++)
        named[k] = -1;
    for (Py_ssize_t k = 0; k < n; k++) {
        PyObject *a = PySequence_Fast_GET_ITEM(positional, k);
        PyObject *check = PySequence_Fast_GET_ITEM(checks, k);
        if (!PyTuple_Check(check) || PyTuple_GET_SIZE(check) != 2)
            goto mismatch;
        PyObject *shape = PyTuple_GET_ITEM(check, 0), *dtype = PyTuple_GET_ITEM(check, 1);
        if (shape == Py_None) {                 /* captured as None */
            if (a != Py_None)
                goto mismatch;
            continue;
        }
        if (shape == marker) {                  /* captured as this value, which the program holds */
            if (Py_TYPE(a) != Py_TYPE(dtype) || PyObject_RichCompareBool(a, dtype, Py_EQ) != 1)
                goto mismatch;
            continue;
        }
        PyObject *array = tensor_array(a, shape, dtype, tensor_type, named);
        if (array == NULL)
            goto mismatch;
        int added = PyList_Append(arrays, array);
        Py_DECREF(array);
        if (added < 0)
            goto mismatch;
    }
    if (all_ids_in_range(arrays, ids) != 1)
        goto mismatch;
    Py_DECREF(positional);
    Py_DECREF(checks);
    Py_DECREF(ids);
    return arrays;
mismatch:               /* the call does not fit, or a check failed: the region's checked path runs it */
    PyErr_Clear();
    Py_XDECREF(positional);
    Py_XDECREF(checks);
    Py_XDECREF(ids);
    Py_XDECREF(arrays);
    Py_RETURN_NONE;
}

static PyObject *
lean_arrays(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (!takes(nargs, 5, "lean_arrays(positional, checks, ids, tensor_type, value_marker)"))
        return NULL;
    return checked_arrays(args[0], args[1], args[2], args[3], args[4]);
}

static PyObject *
ids_fit(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (!takes(nargs, 2, "ids_fit(values, ids)"))
        return NULL;
    int ok = all_ids_in_range(args[0], args[1]);
    PyErr_Clear();                      /* anything else: not in range, for the checked path to run */
    return PyBool_FromLong(ok == 1);
}

/* What `index` picks of `outputs`: the output at an int, or a tuple of what each of a tuple's items
 * picks (a tuple of tensors, or of tuples of them): a new reference, or NULL with an exception set. */
static PyObject *
picked(PyObject *outputs, PyObject *index)
{
    if (!PyTuple_Check(index)) {
        Py_ssize_t at = PyLong_AsSsize_t(index);
        return at == -1 && PyErr_Occurred() ? NULL : PySequence_GetItem(outputs, at);
    }
    if (Py_EnterRecursiveCall(" in a ModelOutput recipe"))
        return NULL;
    PyObject *tuple = PyTuple_New(PyTuple_GET_SIZE(index));
    for (Py_ssize_t k = 0; tuple != NULL && k < PyTuple_GET_SIZE(index); k++) {
        PyObject *item = picked(outputs, PyTuple_GET_ITEM(index, k));
        if (item == NULL)
            Py_CLEAR(tuple);
        else
            PyTuple_SET_ITEM(tuple, k, item);
    }
    Py_LeaveRecursiveCall();
    return tuple;
}

/* The ModelOutput `recipe` describes, (class, {field: None}, keys, getters: an output's index, a
 * tuple of indices or a callable of the outputs), around `outputs`: see hf_outputs.py's model_output. */
static PyObject *
build_model_output(PyObject *recipe, PyObject *outputs)
{
    if (!PyTuple_Check(recipe) || PyTuple_GET_SIZE(recipe) != 4 || !PyType_Check(PyTuple_GET_ITEM(recipe, 0))
            || !PyDict_Check(PyTuple_GET_ITEM(recipe, 1)) || !PyTuple_Check(PyTuple_GET_ITEM(recipe, 2))
            || !PyTuple_Check(PyTuple_GET_ITEM(recipe, 3))
            || PyTuple_GET_SIZE(PyTuple_GET_ITEM(recipe, 2)) != PyTuple_GET_SIZE(PyTuple_GET_ITEM(recipe, 3))) {
        PyErr_SetString(PyExc_TypeError, "a ModelOutput recipe is (class, fields, keys, getters)");
        return NULL;
    }
    PyTypeObject *cls = (PyTypeObject *)PyTuple_GET_ITEM(recipe, 0);
    PyObject *empty = PyTuple_GET_ITEM(recipe, 1), *keys = PyTuple_GET_ITEM(recipe, 2);
    PyObject *getters = PyTuple_GET_ITEM(recipe, 3);
    PyObject *no_args = PyTuple_New(0);
    if (no_args == NULL)
        return NULL;
    PyObject *obj = cls->tp_new(cls, no_args, NULL);           /* cls.__new__(cls) */
    Py_DECREF(no_args);
    if (obj == NULL)
        return NULL;
    if (!PyODict_Check(obj)) {
        PyErr_SetString(PyExc_TypeError, "a ModelOutput recipe's class must be an OrderedDict");
        Py_DECREF(obj);
        return NULL;
    }
    PyObject *attrs = PyObject_GenericGetDict(obj, NULL);
    if (attrs == NULL || PyDict_Update(attrs, empty) < 0)
        goto fail;
    for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(keys); k++) {
        PyObject *key = PyTuple_GET_ITEM(keys, k), *get = PyTuple_GET_ITEM(getters, k);
        PyObject *value = PyLong_CheckExact(get) || PyTuple_Check(get) ? picked(outputs, get)
                          : PyObject_CallOneArg(get, outputs);        /* an object rebuilt around them */
        if (value == NULL)
            goto fail;
        int failed = PyDict_SetItem(attrs, key, value) < 0 || PyODict_SetItem(obj, key, value) < 0;
        Py_DECREF(value);
        if (failed)
            goto fail;
    }
    Py_DECREF(attrs);
    return obj;
fail:
    Py_XDECREF(attrs);
    Py_DECREF(obj);
    return NULL;
}

static PyObject *
model_output(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (!takes(nargs, 2, "model_output(recipe, outputs)"))
        return NULL;
    return build_model_output(args[0], args[1]);
}

/* 1 where keyword `name=value` is one `extras` holds (the same type, the same or an equal value),
 * 0 where not, -1 with an exception set. */
static int
seen_extra(PyObject *extras, PyObject *name, PyObject *value)
{
    PyObject *seen = PyDict_GetItemWithError(extras, name);
    if (seen == NULL)
        return PyErr_Occurred() ? -1 : 0;
    if (Py_TYPE(seen) != Py_TYPE(value))
        return 0;
    return seen == value ? 1 : PyObject_RichCompareBool(value, seen, Py_EQ);
}

/* keyword_positions(args, kwargs, names, fills, extras): see lean_call.py's python_keyword_positions. */
static PyObject *
keyword_positions(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs != 5 || !PyTuple_Check(args[0]) || !PyDict_Check(args[1]) || !PyTuple_Check(args[2])
            || !PyTuple_Check(args[3]) || !PyDict_Check(args[4])
            || PyTuple_GET_SIZE(args[2]) != PyTuple_GET_SIZE(args[3])) {
        PyErr_SetString(PyExc_TypeError, "keyword_positions(args: tuple, kwargs: dict, names: tuple, fills: tuple, "
                                         "extras: dict), names and fills alike in length");
        return NULL;
    }
    if (c_misfit == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "keyword_positions before configure()");
        return NULL;
    }
    PyObject *call = args[0], *kwargs = args[1], *names = args[2], *fills = args[3], *extras = args[4];
    Py_ssize_t n = PyTuple_GET_SIZE(call), count = PyTuple_GET_SIZE(names), taken = 0;
    if (n > count)
        Py_RETURN_NONE;
    PyObject *positional = PyTuple_New(count);
    if (positional == NULL)
        return NULL;
    for (Py_ssize_t k = 0; k < count; k++) {
        PyObject *value;
        if (k < n)
            value = PyTuple_GET_ITEM(call, k);
        else if ((value = PyDict_GetItemWithError(kwargs, PyTuple_GET_ITEM(names, k))) != NULL)
            taken++;
        else if (PyErr_Occurred())
            goto fail;
        else if ((value = PyTuple_GET_ITEM(fills, k)) == c_misfit)
            goto none;
        PyTuple_SET_ITEM(positional, k, Py_NewRef(value));
    }
    if (taken != PyDict_GET_SIZE(kwargs)) {     /* keywords past the captured positions */
        PyObject *name, *value;
        Py_ssize_t at = 0;
        while (PyDict_Next(kwargs, &at, &name, &value)) {
            int named = 0;
            for (Py_ssize_t k = n; k < count && !named; k++)
                if ((named = PyObject_RichCompareBool(name, PyTuple_GET_ITEM(names, k), Py_EQ)) < 0)
                    goto fail;
            if (named)
                continue;
            int seen = seen_extra(extras, name, value);
            if (seen < 0)
                goto fail;
            if (!seen)
                goto none;
        }
    }
    return positional;
none:
    Py_DECREF(positional);
    Py_RETURN_NONE;
fail:
    Py_DECREF(positional);
    return NULL;
}

static PyObject *
configure(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (!takes(nargs, 7, "configure(tensor_type, value_marker, misfit, handle_type, autocast, tracing, flat_leaves)"))
        return NULL;
    PyObject **slots[] = {&c_tensor_type, &c_marker, &c_misfit, &c_handles, &c_autocast, &c_tracing, &c_flat_leaves};
    for (Py_ssize_t k = 0; k < nargs; k++) {
        Py_INCREF(args[k]);
        Py_XSETREF(*slots[k], args[k]);
    }
    Py_RETURN_NONE;
}

/* Whether calling `test` answers True: 1, 0, or -1 with an exception set. */
static int
asks(PyObject *test)
{
    PyObject *answer = PyObject_CallNoArgs(test);
    if (answer == NULL)
        return -1;
    int yes = PyObject_IsTrue(answer);
    Py_DECREF(answer);
    return yes;
}

/* 1 where nothing hooks into the region's call, its own mode is eval and autocast is off (see
 * python_lean_call), 0 where not, -1 with an exception set. */
static int
region_quiet(PyObject *region, PyObject *attrs)
{
    PyObject *quiet_at = PyDict_GetItemWithError(attrs, s_quiet_at), *training;
    if (quiet_at == NULL)
        return PyErr_Occurred() ? -1 : 0;
    PyObject *next_id = PyObject_GetAttr(c_handles, s_next_id);
    if (next_id == NULL)
        return -1;
    int same = PyObject_RichCompareBool(next_id, quiet_at, Py_EQ);
    Py_DECREF(next_id);
    if (same < 0)
        return -1;
    if (!same) {                              /* a hook handle was handed out since: look again */
        PyObject *quiet = PyObject_CallMethodNoArgs(region, s_quiet);
        if (quiet == NULL)
            return -1;
        same = PyObject_IsTrue(quiet);
        Py_DECREF(quiet);
        if (same != 1)
            return same;
    }
    if ((training = PyDict_GetItemWithError(attrs, s_training)) == NULL)
        return PyErr_Occurred() ? -1 : 0;
    int on = PyObject_IsTrue(training);
    if (on != 0)
        return on < 0 ? -1 : 0;
    on = asks(c_autocast);
    return on < 0 ? -1 : !on;
}

static PyObject *
lean_call(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (!takes(nargs, 3, "lean_call(region, lean, positional)"))
        return NULL;
    if (c_misfit == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "lean_call before configure()");
        return NULL;
    }
    PyObject *region = args[0], *lean = args[1], *positional = args[2];
    if (!PyTuple_Check(lean) || PyTuple_GET_SIZE(lean) != 8) {
        PyErr_SetString(PyExc_TypeError, "a lean call is (count, checks, run, single, build, ids, sized, layout)");
        return NULL;
    }
    PyObject *attrs = PyObject_GenericGetDict(region, NULL);
    if (attrs == NULL)
        return NULL;
    int quiet = region_quiet(region, attrs);
    Py_DECREF(attrs);
    if (quiet != 1)
        return quiet < 0 ? NULL : Py_NewRef(c_misfit);
    PyObject *count = PyTuple_GET_ITEM(lean, 0), *checks = PyTuple_GET_ITEM(lean, 1), *run = PyTuple_GET_ITEM(lean, 2);
    PyObject *build = PyTuple_GET_ITEM(lean, 4), *ids = PyTuple_GET_ITEM(lean, 5), *layout = PyTuple_GET_ITEM(lean, 7);
    Py_ssize_t n = PyObject_Length(positional), expected = PyLong_AsSsize_t(count);
    if (n < 0 || (expected == -1 && PyErr_Occurred()))
        return NULL;
    if (n != expected)
        return Py_NewRef(c_misfit);
    PyObject *leaves = layout == Py_None ? Py_NewRef(positional) : PyObject_CallFunctionObjArgs(c_flat_leaves, positional,
                                                                                              layout, NULL);
    if (leaves == NULL)
        return NULL;
    int sized = PyObject_IsTrue(PyTuple_GET_ITEM(lean, 6)), traced = 0;
    /* a call torch.jit traces shows it in its sizes (see lean_call.py); one without them asks */
    if (sized < 0 || (!sized && (traced = asks(c_tracing)) < 0)) {
        Py_DECREF(leaves);
        return NULL;
    }
    PyObject *arrays = leaves == Py_None || traced ? Py_NewRef(Py_None)
                       : checked_arrays(leaves, checks, ids, c_tensor_type, c_marker);
    Py_DECREF(leaves);
    if (arrays == Py_None) {
        Py_DECREF(arrays);
        return Py_NewRef(c_misfit);
    }
    PyObject *outputs = PyObject_CallOneArg(run, arrays);     /* the runtime's error propagates */
    Py_DECREF(arrays);
    if (outputs == NULL)
        return NULL;
    PyObject *out = PyObject_IsTrue(PyTuple_GET_ITEM(lean, 3)) == 1 ? PySequence_GetItem(outputs, 0)
                    : PyTuple_Check(build) ? build_model_output(build, outputs) : PyObject_CallOneArg(build, outputs);
    Py_DECREF(outputs);
    return out;
}

static PyMethodDef methods[] = {
    {"lean_call", (PyCFunction)(void (*)(void))lean_call, METH_FASTCALL,
     "lean_call(region, lean, positional): a built region's output from its runtime's array call, or the "
     "MISFIT marker where the call does not fit (see lean_call.py)"},
    {"model_output", (PyCFunction)(void (*)(void))model_output, METH_FASTCALL,
     "model_output(recipe, outputs): a Hugging Face ModelOutput around a runtime's outputs (see hf_outputs.py)"},
    {"configure", (PyCFunction)(void (*)(void))configure, METH_FASTCALL,
     "configure(tensor_type, value_marker, misfit, handle_type, autocast, tracing, flat_leaves)"},
    {"keyword_positions", (PyCFunction)(void (*)(void))keyword_positions, METH_FASTCALL,
     "keyword_positions(args, kwargs, names, fills, extras): a keyword call as the positional call a lean call "
     "takes, or None (see lean_call.py)"},
    {"ids_fit", (PyCFunction)(void (*)(void))ids_fit, METH_FASTCALL,
     "ids_fit(values, ids): whether every id input among the arrays or CPU tensors is in range (see lean_call.py)"},
    {"lean_arrays", (PyCFunction)(void (*)(void))lean_arrays, METH_FASTCALL,
     "lean_arrays(positional, checks, ids, tensor_type, value_marker): the arrays a built region's "
     "lean call hands its runtime, or None where the call does not fit (see lean_call.py)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef leancall_module = {
    PyModuleDef_HEAD_INIT, "_leancall", "A built region's lean call in C (see lean_call.py).", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC
PyInit__leancall(void)
{
    s_shape = PyUnicode_InternFromString("shape");
    s_dtype = PyUnicode_InternFromString("dtype");
    s_is_contiguous = PyUnicode_InternFromString("is_contiguous");
    s_numpy = PyUnicode_InternFromString("numpy");
    s_next_id = PyUnicode_InternFromString("next_id");
    s_quiet_at = PyUnicode_InternFromString("_quiet_at");
    s_quiet = PyUnicode_InternFromString("_quiet");
    s_training = PyUnicode_InternFromString("training");
    if (!s_shape || !s_dtype || !s_is_contiguous || !s_numpy || !s_next_id || !s_quiet_at || !s_quiet || !s_training)
        return NULL;
    return PyModule_Create(&leancall_module);
}
