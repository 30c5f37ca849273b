//! Compiled conditions in Rust: a comparison of a native reader with its threshold, and the
//! three-valued `all` / `any` / `not` over such tests (rules/compile.py: `_compare_value` and
//! `_node`, which stay the reference and are used for everything else).
//!
//! A test gives True, False or None (undecided). The semantics are those of the Python
//! closures exactly, including the order in which branches are read and where they stop:
//!
//! * `above`: True when value > threshold, False when value <= threshold, else None (NaN);
//!   `below` the mirror; `abs_above` compares |value|;
//! * `all`: False at the first False branch (the later ones are not read); else None when a
//!   branch was None; else True;
//! * `any`: True at the first truthy branch; else False when a branch was decided; else None;
//! * `not`: None stays None, else the negation.
//!
//! A branch that is a Python callable (a condition on dists, ranks, samples...) is called and
//! its result (True, False or None) taken as it is.

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::{PyTraverseError, PyVisit};
use std::sync::{Arc, Mutex};

use super::view::{DistStat, GroupStat, NonFiniteTest};
use super::{lock, Core, Reader};

#[derive(Clone, Copy)]
enum Cmp {
    Above,
    Below,
    AbsAbove,
}

impl Cmp {
    /// `v` against `thr`, three-valued: None when neither holds (NaN).
    #[inline]
    fn test(self, v: f64, thr: f64) -> Option<bool> {
        match self {
            Cmp::Above => decide(v > thr, v <= thr),
            Cmp::Below => decide(v < thr, v >= thr),
            Cmp::AbsAbove => {
                let a = v.abs();
                decide(a > thr, a <= thr)
            }
        }
    }
}

/// `read() > threshold` (or `<`, or `abs(read()) >`), three-valued.
#[pyclass(module = "streams._native", frozen)]
pub struct Compare {
    core: Arc<Mutex<Core>>,
    idx: usize,
    cmp: Cmp,
    thr: f64,
}

impl Compare {
    #[inline]
    fn eval(&self, py: Python<'_>) -> PyResult<Option<bool>> {
        let v = lock(&self.core)?.read(py, self.idx)?;
        Ok(self.cmp.test(v, self.thr))
    }
}

#[inline]
fn decide(holds: bool, fails: bool) -> Option<bool> {
    if holds {
        Some(true)
    } else if fails {
        Some(false)
    } else {
        None
    }
}

#[pymethods]
impl Compare {
    fn __call__(&self, py: Python<'_>) -> PyResult<Option<bool>> {
        self.eval(py)
    }
}

/// `Reader.compare(kind, threshold)`: the native test of that reader against a threshold.
pub fn compare(reader: &Reader, kind: &str, thr: f64) -> PyResult<Compare> {
    let cmp = cmp_of(kind)?;
    Ok(Compare { core: reader.core.clone(), idx: reader.idx, cmp, thr })
}

/// A Python reader (a condition on dists, groups, ranks, samples...) compared with its
/// threshold here: ``read() > threshold`` (``read()[0]`` when ``first``: readers that return
/// ``(value, detail)``), three-valued, as rules/compile.py's `_compare_value` closures.
#[pyclass(module = "streams._native", frozen)]
pub struct CallCompare {
    read: PyObject,
    first: bool,
    cmp: Cmp,
    thr: f64,
}

impl CallCompare {
    #[inline]
    fn eval(&self, py: Python<'_>) -> PyResult<Option<bool>> {
        Ok(self.cmp.test(call_read(py, &self.read, self.first)?, self.thr))
    }
}

/// A Python reader's value: ``read()``, or ``read()[0]`` when ``first``.
#[inline]
fn call_read(py: Python<'_>, read: &PyObject, first: bool) -> PyResult<f64> {
    let r = read.call0(py)?;
    let r = r.bind(py);
    if first {
        r.get_item(0)?.extract()
    } else {
        r.extract()
    }
}

#[pymethods]
impl CallCompare {
    fn __call__(&self, py: Python<'_>) -> PyResult<Option<bool>> {
        self.eval(py)
    }

    /// The reader, for the cycle collector: a compiled rule's closures and the run state they
    /// read form a cycle through this object, which is garbage once the run is dropped.
    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        visit.call(&self.read)
    }
}

/// `compare_call(read, kind, threshold, first)`: the native test of a Python reader.
#[pyfunction]
pub fn compare_call(read: PyObject, kind: &str, threshold: f64, first: bool) -> PyResult<CallCompare> {
    let cmp = cmp_of(kind)?;
    Ok(CallCompare { read, first, cmp, thr: threshold })
}

fn cmp_of(kind: &str) -> PyResult<Cmp> {
    Ok(match kind {
        "above" => Cmp::Above,
        "below" => Cmp::Below,
        "abs_above" => Cmp::AbsAbove,
        _ => return Err(PyValueError::new_err(format!("unknown comparison {kind:?}"))),
    })
}

#[derive(Clone, Copy, PartialEq)]
enum Op {
    All,
    Any,
    Not,
}

/// `all`, `any` or `not` of tests, laid out flat (see [`Flat`]): `ops[0]` is the join, its
/// branches follow. Evaluated by the same walk as a scan's tiers.
#[pyclass(module = "streams._native", frozen)]
pub struct Node {
    ops: Vec<Flat>,
}

#[pymethods]
impl Node {
    fn __call__(&self, py: Python<'_>) -> PyResult<Option<bool>> {
        Ok(eval_flat(py, &self.ops, 0)?.0)
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        for op in &self.ops {
            op.traverse(&visit)?;
        }
        Ok(())
    }
}

/// `join(op, tests)`: the native `all` / `any` / `not` of ``tests``; None when no test is
/// native (the Python closure is then as fast).
#[pyfunction]
pub fn join(py: Python<'_>, op: &str, tests: Vec<PyObject>) -> PyResult<Option<Node>> {
    let op = match op {
        "all" => Op::All,
        "any" => Op::Any,
        "not" => Op::Not,
        _ => return Err(PyValueError::new_err(format!("unknown operator {op:?}"))),
    };
    if tests.is_empty() || (op == Op::Not && tests.len() != 1) {
        return Err(PyValueError::new_err("join: `not` takes one test, `all`/`any` at least one"));
    }
    let mut ops = vec![Flat::Join { op, span: 0 }];
    let mut native = false;
    for t in tests {
        native |= flatten(py, t.bind(py), &mut ops);
    }
    let span = ops.len();
    ops[0] = Flat::Join { op, span };
    Ok(if native { Some(Node { ops }) } else { None })
}

/// A compiled test laid out flat, in the order its branches are read: a join is followed by
/// its branches (`span` ops in all, itself included). The scan of a run's tiers reads one
/// contiguous list instead of following a pointer to a separate object per branch: a run's
/// rules are visited once a step, long after the cache last saw them, and each object reached
/// through a pointer was a cache miss (most of the tree walk's time, measured with perf).
enum Flat {
    Compare { core: Arc<Mutex<Core>>, idx: usize, cmp: Cmp, thr: f64 },
    Call { read: PyObject, first: bool, cmp: Cmp, thr: f64 },
    /// a native reader of the step view (native/src/view.rs) compared with its threshold,
    /// read straight instead of through Python's call protocol (what `Call` of it gives)
    Dist { read: Py<DistStat>, cmp: Cmp, thr: f64 },
    Group { read: Py<GroupStat>, cmp: Cmp, thr: f64 },
    /// a non-finite check (what `Python` of it gives)
    NonFinite(Py<NonFiniteTest>),
    Python(PyObject),
    Join { op: Op, span: usize },
}

impl Flat {
    fn clone_ref(&self, py: Python<'_>) -> Flat {
        match self {
            Flat::Compare { core, idx, cmp, thr } => {
                Flat::Compare { core: core.clone(), idx: *idx, cmp: *cmp, thr: *thr }
            }
            Flat::Call { read, first, cmp, thr } => {
                Flat::Call { read: read.clone_ref(py), first: *first, cmp: *cmp, thr: *thr }
            }
            Flat::Python(f) => Flat::Python(f.clone_ref(py)),
            Flat::Dist { read, cmp, thr } => Flat::Dist { read: read.clone_ref(py), cmp: *cmp, thr: *thr },
            Flat::Group { read, cmp, thr } => Flat::Group { read: read.clone_ref(py), cmp: *cmp, thr: *thr },
            Flat::NonFinite(t) => Flat::NonFinite(t.clone_ref(py)),
            Flat::Join { op, span } => Flat::Join { op: *op, span: *span },
        }
    }

    fn traverse(&self, visit: &PyVisit<'_>) -> Result<(), PyTraverseError> {
        match self {
            Flat::Call { read, .. } => visit.call(read),
            Flat::Python(f) => visit.call(f),
            Flat::Dist { read, .. } => visit.call(read),
            Flat::Group { read, .. } => visit.call(read),
            Flat::NonFinite(t) => visit.call(t),
            _ => Ok(()),
        }
    }
}

/// Append compiled test `t` to `ops`, flat; whether it is native (a Python callable is kept
/// as one op that calls it).
fn flatten(py: Python<'_>, t: &Bound<'_, PyAny>, ops: &mut Vec<Flat>) -> bool {
    if let Ok(c) = t.downcast::<Compare>() {
        let c = c.get();
        ops.push(Flat::Compare { core: c.core.clone(), idx: c.idx, cmp: c.cmp, thr: c.thr });
    } else if let Ok(c) = t.downcast::<CallCompare>() {
        let c = c.get();
        let read = c.read.bind(py);
        if let (Ok(d), false) = (read.downcast::<DistStat>(), c.first) {
            ops.push(Flat::Dist { read: d.clone().unbind(), cmp: c.cmp, thr: c.thr });
        } else if let (Ok(g), true) = (read.downcast::<GroupStat>(), c.first) {
            ops.push(Flat::Group { read: g.clone().unbind(), cmp: c.cmp, thr: c.thr });
        } else {
            ops.push(Flat::Call { read: c.read.clone_ref(py), first: c.first, cmp: c.cmp, thr: c.thr });
        }
    } else if let Ok(n) = t.downcast::<NonFiniteTest>() {
        ops.push(Flat::NonFinite(n.clone().unbind()));
    } else if let Ok(n) = t.downcast::<Node>() {
        ops.extend(n.get().ops.iter().map(|op| op.clone_ref(py)));
    } else {
        ops.push(Flat::Python(t.clone().unbind()));
        return false;
    }
    true
}

/// The verdict of the test at `ops[i]` and the index after it: what the compiled test it was
/// flattened from gives called on its own (the Python closures of rules/compile.py are the
/// reference), reading the same branches in the same order.
fn eval_flat(py: Python<'_>, ops: &[Flat], i: usize) -> PyResult<(Option<bool>, usize)> {
    match &ops[i] {
        Flat::Compare { core, idx, cmp, thr } => {
            let v = lock(core)?.read(py, *idx)?;
            Ok((cmp.test(v, *thr), i + 1))
        }
        Flat::Call { read, first, cmp, thr } => Ok((cmp.test(call_read(py, read, *first)?, *thr), i + 1)),
        Flat::Dist { read, cmp, thr } => Ok((cmp.test(read.get().value(py)?, *thr), i + 1)),
        Flat::Group { read, cmp, thr } => Ok((cmp.test(read.get().value(py)?, *thr), i + 1)),
        Flat::NonFinite(t) => Ok((Some(t.get().test(py)?), i + 1)),
        Flat::Python(f) => {
            let r = f.call0(py)?;
            let r = r.bind(py);
            Ok((if r.is_none() { None } else { Some(r.is_truthy()?) }, i + 1))
        }
        Flat::Join { op, span } => {
            let end = i + span;
            let mut j = i + 1;
            if *op == Op::Not {
                return Ok((eval_flat(py, ops, j)?.0.map(|h| !h), end));
            }
            // `all` stops at the first False, `any` at the first True; past the end, `all` is
            // None when a branch was None (else True), `any` False when one was decided (else None)
            let stop = *op == Op::Any;
            let (mut undecided, mut decided) = (false, false);
            while j < end {
                let (v, next) = eval_flat(py, ops, j)?;
                match v {
                    Some(h) if h == stop => return Ok((Some(stop), end)),
                    Some(_) => decided = true,
                    None => undecided = true,
                }
                j = next;
            }
            let v = if stop { decided.then_some(false) } else { (!undecided).then_some(true) };
            Ok((v, end))
        }
    }
}

/// The tests of a list of tiers, in order, and the alert-state key of each (rules/engine.py:
/// `evaluate`, whose Python loop is the reference). Called with a run's alert states, it reads
/// every test once, in order, and gives ``(index, verdict)`` for the tiers the state machine
/// must see: those whose test holds, and those with a state under their key. The others (no
/// state, and False or None) change nothing.
#[pyclass(module = "streams._native", frozen)]
pub struct Scan {
    /// every tier's test, flattened one after the other
    ops: Vec<Flat>,
    /// where each tier's test starts in `ops`
    starts: Vec<usize>,
    keys: Vec<Py<pyo3::types::PyString>>,
}

#[pymethods]
impl Scan {
    #[new]
    fn new(py: Python<'_>, tests: Vec<PyObject>, keys: Vec<Py<pyo3::types::PyString>>) -> PyResult<Self> {
        if tests.len() != keys.len() {
            return Err(PyValueError::new_err("Scan: one key per test"));
        }
        let mut ops = Vec::new();
        let mut starts = Vec::with_capacity(tests.len());
        for t in tests {
            starts.push(ops.len());
            flatten(py, t.bind(py), &mut ops);
        }
        Ok(Scan { ops, starts, keys })
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        for op in &self.ops {
            op.traverse(&visit)?;
        }
        Ok(())
    }

    fn __call__(
        &self,
        py: Python<'_>,
        states: &Bound<'_, pyo3::types::PyDict>,
    ) -> PyResult<Vec<(usize, Option<bool>)>> {
        self.hits(py, states, usize::MAX)
    }
}

impl Scan {
    /// What `__call__` gives, its first `most` tiers at most (reading stops there: the tests
    /// only read).
    pub(crate) fn hits(
        &self,
        py: Python<'_>,
        states: &Bound<'_, pyo3::types::PyDict>,
        most: usize,
    ) -> PyResult<Vec<(usize, Option<bool>)>> {
        let any_state = !states.is_empty();
        let mut out = Vec::new();
        for (i, &at) in self.starts.iter().enumerate() {
            let v = eval_flat(py, &self.ops, at)?.0;
            if v == Some(true) || (any_state && states.contains(self.keys[i].bind(py))?) {
                out.push((i, v));
                if out.len() >= most {
                    break;
                }
            }
        }
        Ok(out)
    }
}
