/* The checks of a built region's lean call in C: cuvil_pgc.recompile.lean_checks.lean_arrays.
 *
 * lean_arrays(positional, checks, ids, tensor_type, value_marker) -> list of NumPy arrays, or None
 *
 * Between a runtime's inferences every line of Python runs on cold caches: in one process,
 * interleaved, the Python checks of the zoo's tiny BERT (one id input, OpenVINO) cost 17-21 µs
 * over the bare array call and these 2-4 µs. The semantics are the Python version's, which
 * lean_checks.py holds and the tests compare this one with; any error is a mismatch (None): the
 * region's checked path runs the call and raises what it must.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

static PyObject *s_shape, *s_dtype, *s_is_contiguous, *s_numpy;

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

/* The array of tensor `a` captured as (shape, dtype): a new reference, or NULL (a mismatch, with
 * any exception cleared). A size that is not an int means torch.jit's tracer hands them out (it
 * records the call; it must not run): a mismatch too. */
static PyObject *
tensor_array(PyObject *a, PyObject *shape, PyObject *dtype, PyObject *tensor_type)
{
    if ((PyObject *)Py_TYPE(a) != tensor_type)
        return NULL;
    PyObject *s = PyObject_GetAttr(a, s_shape);
    if (s == NULL)
        goto fail;
    int same = PyTuple_Check(s) && (PyTuple_GET_SIZE(s) == 0 || PyLong_CheckExact(PyTuple_GET_ITEM(s, 0)))
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

static PyObject *
lean_arrays(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError,
                        "lean_arrays(positional, checks, ids, tensor_type, value_marker) takes 5 arguments");
        return NULL;
    }
    (void)module;
    PyObject *tensor_type = args[3], *marker = args[4];
    PyObject *positional = NULL, *checks = NULL, *ids = NULL, *arrays = NULL;
    if ((positional = PySequence_Fast(args[0], "")) == NULL || (checks = PySequence_Fast(args[1], "")) == NULL
            || (ids = PySequence_Fast(args[2], "")) == NULL || (arrays = PyList_New(0)) == NULL)
        goto mismatch;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(positional);
    if (n != PySequence_Fast_GET_SIZE(checks))
        goto mismatch;
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
        PyObject *array = tensor_array(a, shape, dtype, tensor_type);
        if (array == NULL)
            goto mismatch;
        int added = PyList_Append(arrays, array);
        Py_DECREF(array);
        if (added < 0)
            goto mismatch;
    }
    for (Py_ssize_t k = 0; k < PySequence_Fast_GET_SIZE(ids); k++) {
        PyObject *id = PySequence_Fast_GET_ITEM(ids, k);    /* (position, unsigned dtype, rows, limit) */
        if (!PyTuple_Check(id) || PyTuple_GET_SIZE(id) != 4)
            goto mismatch;
        Py_ssize_t at = PyLong_AsSsize_t(PyTuple_GET_ITEM(id, 0));
        if (at < 0 || at >= PyList_GET_SIZE(arrays)
                || ids_in_range(PyList_GET_ITEM(arrays, at), PyTuple_GET_ITEM(id, 2), PyTuple_GET_ITEM(id, 3)) != 1)
            goto mismatch;
    }
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

static PyMethodDef methods[] = {
    {"lean_arrays", (PyCFunction)(void (*)(void))lean_arrays, METH_FASTCALL,
     "lean_arrays(positional, checks, ids, tensor_type, value_marker): the arrays a built region's "
     "lean call hands its runtime, or None where the call does not fit (see lean_checks.py)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef leancall_module = {
    PyModuleDef_HEAD_INIT, "_leancall", "The lean call's checks in C (see lean_checks.py).", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC
PyInit__leancall(void)
{
    s_shape = PyUnicode_InternFromString("shape");
    s_dtype = PyUnicode_InternFromString("dtype");
    s_is_contiguous = PyUnicode_InternFromString("is_contiguous");
    s_numpy = PyUnicode_InternFromString("numpy");
    if (!s_shape || !s_dtype || !s_is_contiguous || !s_numpy)
        return NULL;
    return PyModule_Create(&leancall_module);
}
