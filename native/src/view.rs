//! The step at hand as a run's rules read it besides its signals: whether its metrics are all
//! finite, and the moments of its per-sample arrays, each worked out once per step
//! (streams/run.py: `PyStepView` is the reference, `RunState` sets the view at each step).
//!
//! Its readers stand in for Python closures that the rule scan called at every step:
//! [`DistStat`], a statistic of one array (`_Source.dist_stat`); [`GroupStat`], a statistic of
//! a group's trends (`_Source.group_stat`), which the run works out once per step and sets
//! here; [`NonFinite`], the names of the non-finite metrics (`_Source.nonfinite`), and
//! [`NonFiniteTest`], the test of a non-finite check, which the scan reads natively. Both look
//! at nothing when every metric is finite.

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyFloat, PyList, PyString, PyTuple};
use pyo3::{PyTraverseError, PyVisit};
use std::sync::{Arc, Mutex};

use super::dists::{Floats, Moments};
use super::lock_of;

const NAN: f64 = f64::NAN;

struct ViewData {
    metrics: Option<Py<PyDict>>,
    dists: Option<Py<PyDict>>,
    /// whether the metrics are all finite, once asked
    finite: Option<bool>,
    /// the moments of each array asked for (None: the step has no such array)
    moments: Vec<(Py<PyString>, Option<Py<Moments>>)>,
    /// the trends of each group the step has: (slopes, gap slope, gap, lowest, highest, unit)
    groups: Vec<(Py<PyString>, Py<PyTuple>)>,
}

type Data = Arc<Mutex<ViewData>>;

fn data_lock(d: &Data) -> PyResult<std::sync::MutexGuard<'_, ViewData>> {
    lock_of(d, "step view")
}

/// Whether every value of `metrics` is finite, as streams.run._all_finite tells it: by one
/// left-to-right sum (a sum that overflowed reads "not finite"; the readers then look value
/// by value).
fn all_finite(metrics: &Bound<'_, PyDict>) -> PyResult<bool> {
    let mut total = 0.0f64;
    for v in metrics.values().iter() {
        total += match v.downcast::<PyFloat>() {
            Ok(f) => f.value(),
            Err(_) => v.extract::<f64>()?,
        };
    }
    Ok(total - total == 0.0)
}

fn finite_of(py: Python<'_>, d: &mut ViewData) -> PyResult<bool> {
    if let Some(f) = d.finite {
        return Ok(f);
    }
    let f = match &d.metrics {
        Some(m) => all_finite(m.bind(py))?,
        None => true,
    };
    d.finite = Some(f);
    Ok(f)
}

fn moments_of(py: Python<'_>, d: &mut ViewData, name: &Bound<'_, PyString>) -> PyResult<Option<Py<Moments>>> {
    for (k, m) in &d.moments {
        if k.as_ptr() == name.as_ptr() || k.bind(py).as_any().eq(name)? {
            return Ok(m.as_ref().map(|m| m.clone_ref(py)));
        }
    }
    let m = match &d.dists {
        Some(dists) => match dists.bind(py).get_item(name)? {
            Some(xs) => Some(Py::new(py, Moments::of(xs.extract::<Floats>()?))?),
            None => None,
        },
        None => None,
    };
    d.moments.push((name.clone().unbind(), m.as_ref().map(|m| m.clone_ref(py))));
    Ok(m)
}

/// The step at hand of one run: ``set(metrics, dists)`` at each step, then ``finite()`` and
/// ``moments(name)`` (the same objects until the next ``set``).
#[pyclass(module = "streams._native", frozen)]
pub struct StepView {
    data: Data,
}

#[pymethods]
impl StepView {
    #[new]
    fn new() -> Self {
        StepView {
            data: Arc::new(Mutex::new(ViewData {
                metrics: None,
                dists: None,
                finite: None,
                moments: Vec::new(),
                groups: Vec::new(),
            })),
        }
    }

    /// The step at hand: its metrics and its per-sample arrays (what was worked out for the
    /// last one is forgotten).
    fn set(&self, metrics: Bound<'_, PyDict>, dists: Bound<'_, PyDict>) -> PyResult<()> {
        let mut d = data_lock(&self.data)?;
        d.metrics = Some(metrics.unbind());
        d.dists = Some(dists.unbind());
        d.finite = None;
        d.moments.clear();
        d.groups.clear();
        Ok(())
    }

    /// The trends of the step's group ``key`` (``RunState.group_trends``: slopes by category,
    /// the gap's slope, the gap, the lowest and the highest finite slope or None, the noise
    /// unit that a ``_z`` statistic multiplies its slope by).
    fn set_group(&self, key: Bound<'_, PyString>, trends: Bound<'_, PyTuple>) -> PyResult<()> {
        if trends.len() != 6 {
            return Err(pyo3::exceptions::PyValueError::new_err("set_group: six trends"));
        }
        data_lock(&self.data)?.groups.push((key.unbind(), trends.unbind()));
        Ok(())
    }

    /// Whether every metric of the step is finite.
    fn finite(&self, py: Python<'_>) -> PyResult<bool> {
        finite_of(py, &mut *data_lock(&self.data)?)
    }

    /// The moments of the step's array ``name`` (a ``Moments``), None when it has none.
    fn moments(&self, py: Python<'_>, name: Bound<'_, PyString>) -> PyResult<Option<Py<Moments>>> {
        moments_of(py, &mut *data_lock(&self.data)?, &name)
    }

    /// The reader of statistic ``stat`` of the step's array ``name`` (NaN without one).
    #[pyo3(signature = (name, stat, cap))]
    fn dist_stat(&self, name: Bound<'_, PyString>, stat: String, cap: Option<f64>) -> DistStat {
        DistStat { data: self.data.clone(), name: name.unbind(), stat, cap }
    }

    /// The reader of statistic ``stat`` of group ``key`` (``(value, slopes or None)``;
    /// ``(nan, None)`` when the step has no such group).
    fn group_stat(&self, key: Bound<'_, PyString>, stat: String) -> PyResult<GroupStat> {
        // a ``_z`` statistic is its slope's in the group's noise unit (trends' sixth item)
        let (base, z) = match stat.strip_suffix("_z") {
            Some(b) => (b, true),
            None => (stat.as_str(), false),
        };
        let stat = match base {
            "gap" => GroupSig::Gap,
            "gap_slope" => GroupSig::GapSlope,
            "min_slope" => GroupSig::Min,
            "max_slope" => GroupSig::Max,
            _ => GroupSig::Range,
        };
        Ok(GroupStat { data: self.data.clone(), key: key.unbind(), stat, z: z && stat != GroupSig::Gap })
    }

    /// The reader of the step's non-finite metrics among ``names`` (every metric when None).
    #[pyo3(signature = (names=None))]
    fn nonfinite(&self, names: Option<Vec<Py<PyString>>>) -> NonFinite {
        NonFinite { data: self.data.clone(), names }
    }

    /// The test of a non-finite check over ``names`` (every metric when None).
    #[pyo3(signature = (names=None))]
    fn nonfinite_test(&self, names: Option<Vec<Py<PyString>>>) -> NonFiniteTest {
        NonFiniteTest { data: self.data.clone(), names }
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        if let Ok(d) = self.data.try_lock() {
            if let Some(m) = &d.metrics {
                visit.call(m)?;
            }
            if let Some(m) = &d.dists {
                visit.call(m)?;
            }
            for (_, t) in &d.groups {
                visit.call(t)?;
            }
        }
        Ok(())
    }
}

/// ``moments(name).value(stat, cap)`` of the step at hand, NaN when it has no array ``name``.
#[pyclass(module = "streams._native", frozen)]
pub struct DistStat {
    data: Data,
    name: Py<PyString>,
    stat: String,
    cap: Option<f64>,
}

impl DistStat {
    /// What a call gives (the rule scan calls this straight, without the call protocol).
    pub(crate) fn value(&self, py: Python<'_>) -> PyResult<f64> {
        let m = moments_of(py, &mut *data_lock(&self.data)?, self.name.bind(py))?;
        match m {
            None => Ok(NAN),
            Some(m) => m.bind(py).borrow_mut().value(&self.stat, self.cap),
        }
    }
}

#[pymethods]
impl DistStat {
    fn __call__(&self, py: Python<'_>) -> PyResult<f64> {
        self.value(py)
    }
}

#[derive(Clone, Copy, PartialEq)]
enum GroupSig {
    Gap,
    GapSlope,
    Min,
    Max,
    Range,
}

/// A statistic of the step's group ``key`` as ``_Source.group_stat``'s reader gives it:
/// ``(value, slopes by category)`` (the slopes only where an alert's detail may show them).
#[pyclass(module = "streams._native", frozen)]
pub struct GroupStat {
    data: Data,
    key: Py<PyString>,
    stat: GroupSig,
    z: bool,
}

impl GroupStat {
    /// The trends of the step's group, None when it has none.
    fn trends(&self, py: Python<'_>) -> PyResult<Option<Py<PyTuple>>> {
        let d = data_lock(&self.data)?;
        let key = self.key.bind(py);
        for (k, t) in &d.groups {
            if k.as_ptr() == key.as_ptr() || k.bind(py).as_any().eq(key)? {
                return Ok(Some(t.clone_ref(py)));
            }
        }
        Ok(None)
    }

    /// The value of what a call gives, ``call()[0]`` as a float, without the tuple (the rule
    /// scan reads this straight).
    pub(crate) fn value(&self, py: Python<'_>) -> PyResult<f64> {
        let Some(t) = self.trends(py)? else {
            return Ok(NAN);
        };
        let t = t.bind(py);
        let item = |i: usize| -> PyResult<Bound<'_, PyAny>> { t.get_item(i) };
        let v: f64 = match self.stat {
            GroupSig::Gap => item(2)?.extract()?,
            GroupSig::GapSlope => item(1)?.extract()?,
            _ => {
                let lo = item(3)?;
                if lo.is_none() {
                    return Ok(NAN);
                } else {
                    match self.stat {
                        GroupSig::Min => lo.extract()?,
                        GroupSig::Max => item(4)?.extract()?,
                        _ => item(4)?.extract::<f64>()? - lo.extract::<f64>()?,
                    }
                }
            }
        };
        Ok(if self.z { v * item(5)?.extract::<f64>()? } else { v })
    }
}

#[pymethods]
impl GroupStat {
    fn __call__(&self, py: Python<'_>) -> PyResult<PyObject> {
        let trends = self.trends(py)?;
        let none = py.None();
        let Some(t) = trends else {
            return Ok((NAN, none).into_py(py));
        };
        let t = t.bind(py);
        let slopes = t.get_item(0)?;
        let (lo, hi) = (t.get_item(3)?, t.get_item(4)?);
        if self.stat == GroupSig::Gap {
            return Ok((t.get_item(2)?, none).into_py(py));
        }
        if self.stat != GroupSig::GapSlope && lo.is_none() {
            return Ok((NAN, none).into_py(py));
        }
        let scale: f64 = if self.z { t.get_item(5)?.extract()? } else { 1.0 };
        let v: f64 = match self.stat {
            GroupSig::GapSlope => t.get_item(1)?.extract()?,
            GroupSig::Min => lo.extract()?,
            GroupSig::Max => hi.extract()?,
            _ => hi.extract::<f64>()? - lo.extract::<f64>()?,
        };
        Ok((v * scale, slopes).into_py(py))
    }
}

/// The non-finite metrics of the step at hand, by name: each metric of ``names`` (every metric
/// when None) whose value ``x`` has ``x - x != 0`` (NaN or an infinity), as `_Source.nonfinite`
/// tells them. Nothing is looked at when every metric is finite.
fn nonfinite_of<'py>(py: Python<'py>, data: &Data, names: &Option<Vec<Py<PyString>>>, first_only: bool) -> PyResult<Vec<Bound<'py, PyAny>>> {
    let metrics = {
        let mut d = data_lock(data)?;
        if finite_of(py, &mut d)? {
            return Ok(Vec::new());
        }
        match &d.metrics {
            Some(m) => m.clone_ref(py),
            None => return Ok(Vec::new()),
        }
    };
    let metrics = metrics.bind(py);
    let bad = |v: &Bound<'_, PyAny>| -> PyResult<bool> {
        let x = match v.downcast::<PyFloat>() {
            Ok(f) => f.value(),
            Err(_) => v.extract::<f64>()?,
        };
        Ok(!x.is_finite())
    };
    // (the names as the objects they are: any str, a lone surrogate included)
    let mut out = Vec::new();
    match names {
        None => {
            for (k, v) in metrics.iter() {
                if bad(&v)? {
                    out.push(k);
                    if first_only {
                        break;
                    }
                }
            }
        }
        Some(names) => {
            for n in names {
                let n = n.bind(py);
                if let Some(v) = metrics.get_item(n)? {
                    if bad(&v)? {
                        out.push(n.clone().into_any());
                        if first_only {
                            break;
                        }
                    }
                }
            }
        }
    }
    Ok(out)
}

/// The reader of the step's non-finite metrics among ``names`` (every metric when None): their
/// names, sorted (an empty list when all are finite).
#[pyclass(module = "streams._native", frozen)]
pub struct NonFinite {
    data: Data,
    names: Option<Vec<Py<PyString>>>,
}

#[pymethods]
impl NonFinite {
    fn __call__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let out = PyList::new_bound(py, nonfinite_of(py, &self.data, &self.names, false)?);
        out.sort()?; // (Python's order of str)
        Ok(out)
    }
}

/// The test of a non-finite check: whether a metric among ``names`` (every metric when None)
/// is not finite, False at once when every metric of the step is. The rule scan reads it
/// natively (native/src/logic.rs).
#[pyclass(module = "streams._native", frozen)]
pub struct NonFiniteTest {
    data: Data,
    names: Option<Vec<Py<PyString>>>,
}

impl NonFiniteTest {
    /// What a call gives (the rule scan calls this straight).
    pub(crate) fn test(&self, py: Python<'_>) -> PyResult<bool> {
        Ok(!nonfinite_of(py, &self.data, &self.names, true)?.is_empty())
    }
}

#[pymethods]
impl NonFiniteTest {
    fn __call__(&self, py: Python<'_>) -> PyResult<bool> {
        self.test(py)
    }
}
