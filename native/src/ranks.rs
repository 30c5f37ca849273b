//! The cross-rank buffer of a run (`streams/ranks.py`: `PyRankBuffer` is the reference), in
//! Rust: each rank's values of the metrics the cross-rank rules read, and its hashes, per step,
//! and the readers that compare the ranks of a complete step. The same values, in the same
//! order, as the Python one.

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyFloat, PyList, PyString, PyTuple};

use crate::wire::RankStep;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

const NAN: f64 = f64::NAN;

struct Entry {
    rank: i64,
    /// (index into `Buf::names`, value), in the order they were kept (the value objects as
    /// they came: a state written from here holds the same objects as the Python buffer's)
    m: Vec<(usize, PyObject)>,
    /// the rank's hashes
    h: Hashes,
}

/// A rank's hashes: as they came (a dict of name -> hash), or still in the bytes of the step
/// `read_rank_step` read (a dict is made only when the buffer's state is written; the hash
/// check compares the bytes).
enum Hashes {
    Dict(PyObject),
    Read(Py<RankStep>),
}

impl Hashes {
    fn dict(&self, py: Python<'_>) -> PyResult<PyObject> {
        match self {
            Hashes::Dict(d) => Ok(d.clone_ref(py)),
            Hashes::Read(ev) => Ok(ev.get().hashes_dict(py)?.into_any().unbind()),
        }
    }
}

struct Pending {
    step: i64,
    ranks: Vec<Entry>,
}

/// (top value, its rank, median) of one metric at the step at hand; None: fewer than 2 values
type Memo = Option<(f64, i64, f64)>;

struct Buf {
    max_pending: usize,
    /// every metric name met (kept now, or in a loaded state): the indices of `Entry::m`
    names: Vec<Py<PyString>>,
    /// the indices of the metrics kept from each rank's steps
    tracked: Vec<usize>,
    /// in the order the steps came
    pending: Vec<Pending>,
    current: Vec<Entry>,
    memo: Vec<Option<Memo>>,
    /// held_over_median's ratios, per metric a reader asked for, in the order they asked
    held: Vec<Held>,
}

/// The last ratios of each rank (HELD_POINTS - 1 at most) of one metric, in the order the ranks
/// came, with an index by rank (a run of a thousand ranks is not searched a thousand times).
struct Held {
    metric: usize,
    ranks: Vec<(i64, Vec<f64>)>,
    at: HashMap<i64, usize>,
}

impl Held {
    fn new(metric: usize) -> Held {
        Held { metric, ranks: Vec::new(), at: HashMap::new() }
    }

    fn get(&self, rank: i64) -> Option<&Vec<f64>> {
        self.at.get(&rank).map(|&i| &self.ranks[i].1)
    }

    fn slot(&mut self, rank: i64) -> &mut Vec<f64> {
        let n = self.ranks.len();
        let i = *self.at.entry(rank).or_insert(n);
        if i == n {
            self.ranks.push((rank, Vec::new()));
        }
        &mut self.ranks[i].1
    }

    fn clear(&mut self) {
        self.ranks.clear();
        self.at.clear();
    }
}

/// ratios a rank's held_over_median takes the middle of (this step's and the ones before)
const HELD_POINTS: usize = 3;

fn ratio_pos(x: f64, base: f64) -> f64 {
    if base == 0.0 {
        if x > 0.0 { f64::INFINITY } else { NAN }
    } else {
        x / base
    }
}

impl Buf {
    fn name_index(&mut self, py: Python<'_>, name: &Bound<'_, PyString>) -> PyResult<usize> {
        for (i, n) in self.names.iter().enumerate() {
            if n.bind(py).as_any().eq(name)? {
                return Ok(i);
            }
        }
        self.names.push(name.clone().unbind());
        Ok(self.names.len() - 1)
    }

    fn close(&mut self, py: Python<'_>) -> PyResult<()> {
        self.leave(py)?;
        self.current = Vec::new();
        self.memo.clear();
        Ok(())
    }

    /// The finite values of metric `idx` at the step at hand, by rank in the order they came.
    fn values(&self, py: Python<'_>, idx: usize) -> PyResult<Vec<(i64, f64)>> {
        let mut values: Vec<(i64, f64)> = Vec::with_capacity(self.current.len());
        for e in &self.current {
            if let Some((_, v)) = e.m.iter().find(|(i, _)| *i == idx) {
                let v = v.bind(py);
                if v.is_none() {
                    continue;     // (a state read back from JSON, where NaN was written null)
                }
                let v: f64 = v.extract()?;
                if v - v == 0.0 {
                    values.push((e.rank, v));
                }
            }
        }
        Ok(values)
    }

    /// Each rank's value over the median of the step at hand, in the order the ranks came
    /// (empty with fewer than two finite values).
    fn ratios(&mut self, py: Python<'_>, idx: usize) -> PyResult<Vec<(i64, f64)>> {
        let Some((_, _, med)) = self.stat(py, idx)? else {
            return Ok(Vec::new());
        };
        Ok(self.values(py, idx)?.into_iter().map(|(r, v)| (r, ratio_pos(v, med))).collect())
    }

    /// Keep the ratios of the step at hand that held_over_median reads later.
    fn leave(&mut self, py: Python<'_>) -> PyResult<()> {
        if self.current.is_empty() {
            return Ok(());
        }
        for h in 0..self.held.len() {
            let got = self.ratios(py, self.held[h].metric)?;
            let held = &mut self.held[h];
            for (r, x) in got {
                if x != x {
                    continue;
                }
                let kept = held.slot(r);
                kept.push(x);
                if kept.len() >= HELD_POINTS {
                    kept.remove(0);
                }
            }
        }
        Ok(())
    }

    /// held_over_median of the step at hand: (the largest middle ratio, its rank), or None.
    fn held_stat(&mut self, py: Python<'_>, idx: usize) -> PyResult<Option<(f64, i64)>> {
        let Some(h) = self.held.iter().position(|h| h.metric == idx) else {
            return Ok(None);
        };
        let ratios = self.ratios(py, idx)?;
        let held = &self.held[h];
        let mut top: Option<(f64, i64)> = None;
        for (r, x) in ratios {
            if x != x {
                continue;
            }
            let Some(kept) = held.get(r) else { continue };
            if kept.len() < HELD_POINTS - 1 {
                continue;
            }
            let (a, b) = (kept[kept.len() - 2], kept[kept.len() - 1]);
            let mid = a.min(b).max(a.max(b).min(x));     // the middle of the three
            if top.map_or(true, |(t, _)| mid > t) {      // the first of the largest
                top = Some((mid, r));
            }
        }
        Ok(top)
    }

    fn stat(&mut self, py: Python<'_>, idx: usize) -> PyResult<Memo> {
        if let Some(Some(got)) = self.memo.get(idx) {
            return Ok(*got);
        }
        let values = self.values(py, idx)?;
        let mut top: Option<(i64, f64)> = None;
        for &(r, v) in &values {
            if top.map_or(true, |(_, t)| v > t) {
                top = Some((r, v));     // the first of the largest
            }
        }
        let got = match top {
            Some((top, top_value)) if values.len() >= 2 => {
                let mut sorted: Vec<f64> = values.iter().map(|(_, v)| *v).collect();
                sorted.sort_by(|a, b| a.partial_cmp(b).unwrap());     // finite values only
                Some((top_value, top, super::median_of(&sorted)))
            }
            _ => None,
        };
        if self.memo.len() <= idx {
            self.memo.resize(idx + 1, None);
        }
        self.memo[idx] = Some(got);
        Ok(got)
    }
}

fn lock(buf: &Arc<Mutex<Buf>>) -> PyResult<MutexGuard<'_, Buf>> {
    super::lock_of(buf, "RankBuffer")
}

fn int_key(k: &Bound<'_, PyAny>) -> PyResult<i64> {
    // int(k) of the state's keys: digits as text (a state written as JSON), or an int
    if let Ok(i) = k.extract::<i64>() {
        return Ok(i);
    }
    let s: String = k.str()?.extract()?;
    s.trim()
        .parse::<i64>()
        .map_err(|_| PyValueError::new_err(format!("not a step or rank number: {s:?}")))
}

/// Keep `entry` (a rank's values at `step`); the steps now complete or given up on, in order.
fn keep(b: &mut Buf, step: i64, entry: Entry, world: i64) -> Vec<i64> {
    let at = match b.pending.iter().rposition(|p| p.step == step) {
        Some(at) => at,
        None => {
            b.pending.push(Pending { step, ranks: Vec::new() });
            b.pending.len() - 1
        }
    };
    let rank = entry.rank;
    let ranks = &mut b.pending[at].ranks;
    // a rank already in keeps its place (as a dict's key does)
    match ranks.iter().position(|e| e.rank == rank) {
        Some(j) => ranks[j] = entry,
        None => ranks.push(entry),
    }
    let complete = ranks.len() as i64 >= world;
    // steps that will never complete (a rank missed them): give up on the oldest
    if b.pending.len() > b.max_pending {
        let oldest = b.pending.iter().map(|p| p.step).min().unwrap();
        if oldest != step {
            return if complete {
                if step < oldest { vec![step, oldest] } else { vec![oldest, step] }
            } else {
                vec![oldest]
            };
        }
    }
    if complete { vec![step] } else { Vec::new() }
}

/// The cross-rank buffer of one run (streams.ranks.PyRankBuffer, in Rust).
#[pyclass(module = "streams._native", frozen)]
pub struct RankBuffer {
    buf: Arc<Mutex<Buf>>,
}

impl RankBuffer {
    /// `take` of a step that `read_rank_step` read (its metrics and hashes read from the
    /// event's bytes): the steps now complete or given up on (also for `routine.rs`).
    pub(crate) fn take_read(&self, py: Python<'_>, event: &Bound<'_, RankStep>, world: i64) -> PyResult<Vec<i64>> {
        let ev = event.get();
        let h = Hashes::Read(event.clone().unbind());
        let mut b = lock(&self.buf)?;
        let mut m = Vec::with_capacity(b.tracked.len());
        for &i in &b.tracked {
            if let Some(v) = ev.metric(py, b.names[i].bind(py).to_str()?) {
                m.push((i, PyFloat::new_bound(py, v).into_any().unbind()));
            }
        }
        Ok(keep(&mut b, ev.step(), Entry { rank: ev.rank(), m, h }, world))
    }

    /// `open(step)`, and where the step was in the buffer (None: it was not there), for
    /// `put_back`.
    pub(crate) fn open_at(&self, py: Python<'_>, step: i64) -> PyResult<Option<usize>> {
        let mut b = lock(&self.buf)?;
        b.leave(py)?;
        let at = b.pending.iter().position(|p| p.step == step);
        b.current = match at {
            Some(at) => b.pending.remove(at).ranks,
            None => Vec::new(),
        };
        b.memo.clear();
        Ok(at)
    }

    /// Undo `open_at(step)`, which gave `at`: the step goes back where it was, as if it had
    /// never been opened.
    pub(crate) fn put_back(&self, step: i64, at: Option<usize>) -> PyResult<()> {
        let mut b = lock(&self.buf)?;
        let ranks = std::mem::take(&mut b.current);
        if let Some(at) = at {
            b.pending.insert(at, Pending { step, ranks });
        }
        b.memo.clear();      // (nothing at hand: no ratio is kept)
        Ok(())
    }

    /// `close()`.
    pub(crate) fn shut(&self, py: Python<'_>) -> PyResult<()> {
        lock(&self.buf)?.close(py)
    }
}

#[pymethods]
impl RankBuffer {
    #[new]
    fn new(max_pending: usize) -> RankBuffer {
        RankBuffer {
            buf: Arc::new(Mutex::new(Buf {
                max_pending,
                names: Vec::new(),
                tracked: Vec::new(),
                pending: Vec::new(),
                current: Vec::new(),
                memo: Vec::new(),
                held: Vec::new(),
            })),
        }
    }

    fn __len__(&self) -> PyResult<usize> {
        Ok(lock(&self.buf)?.pending.len())
    }

    /// Keep `metric` from each rank's steps from now on.
    fn track(&self, py: Python<'_>, metric: &Bound<'_, PyString>) -> PyResult<()> {
        let mut b = lock(&self.buf)?;
        let i = b.name_index(py, metric)?;
        if !b.tracked.contains(&i) {
            b.tracked.push(i);
        }
        Ok(())
    }

    /// Keep a rank's step; the steps now complete or given up on, in order.
    fn take(
        &self,
        py: Python<'_>,
        step: i64,
        rank: i64,
        metrics: &Bound<'_, PyDict>,
        hashes: PyObject,
        world: i64,
    ) -> PyResult<Vec<i64>> {
        let mut b = lock(&self.buf)?;
        let mut m = Vec::with_capacity(b.tracked.len());
        for &i in &b.tracked {
            if let Some(v) = metrics.get_item(b.names[i].bind(py))? {
                m.push((i, v.unbind()));
            }
        }
        Ok(keep(&mut b, step, Entry { rank, m, h: Hashes::Dict(hashes) }, world))
    }

    /// `take` of a step that `read_rank_step` read (its metrics and hashes read from the
    /// event's bytes): the same values kept.
    fn take_step(&self, py: Python<'_>, event: &Bound<'_, RankStep>, world: i64) -> PyResult<Vec<i64>> {
        self.take_read(py, event, world)
    }

    /// Make `step` the step the readers compare (it leaves the buffer).
    fn open(&self, py: Python<'_>, step: i64) -> PyResult<()> {
        let mut b = lock(&self.buf)?;
        b.leave(py)?;
        let got = match b.pending.iter().position(|p| p.step == step) {
            Some(at) => b.pending.remove(at).ranks,
            None => Vec::new(),
        };
        b.current = got;
        b.memo.clear();
        Ok(())
    }

    fn close(&self, py: Python<'_>) -> PyResult<()> {
        lock(&self.buf)?.close(py)
    }

    /// Forget the steps waiting (a run started over); the ratios kept go too.
    fn clear(&self, py: Python<'_>) -> PyResult<()> {
        let mut b = lock(&self.buf)?;
        b.pending.clear();
        b.close(py)?;
        for held in b.held.iter_mut() {
            held.clear();
        }
        Ok(())
    }

    fn rank_stat(
        &self,
        py: Python<'_>,
        metric: &Bound<'_, PyString>,
        stat: &str,
    ) -> PyResult<RankStat> {
        let stat = match stat {
            "max_over_median" => Stat::MaxOverMedian,
            "max" => Stat::Max,
            "median" => Stat::Median,
            "held_over_median" => Stat::HeldOverMedian,
            _ => return Err(PyValueError::new_err(format!("unknown rank statistic '{stat}'"))),
        };
        let mut b = lock(&self.buf)?;
        let idx = b.name_index(py, metric)?;
        if matches!(stat, Stat::HeldOverMedian) && !b.held.iter().any(|h| h.metric == idx) {
            b.held.push(Held::new(idx));
        }
        drop(b);
        Ok(RankStat { buf: self.buf.clone(), idx, stat })
    }

    fn hash_mismatch(&self, name: &Bound<'_, PyString>) -> HashMismatch {
        HashMismatch { buf: self.buf.clone(), name: name.clone().unbind() }
    }

    fn to_state<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let b = lock(&self.buf)?;
        let out = PyDict::new_bound(py);
        for p in &b.pending {
            let ranks = PyDict::new_bound(py);
            for e in &p.ranks {
                let m = PyDict::new_bound(py);
                for (i, v) in &e.m {
                    m.set_item(b.names[*i].bind(py), v.bind(py))?;
                }
                let d = PyDict::new_bound(py);
                d.set_item("m", m)?;
                d.set_item("h", e.h.dict(py)?)?;
                ranks.set_item(e.rank.to_string(), d)?;
            }
            out.set_item(p.step.to_string(), ranks)?;
        }
        Ok(out)
    }

    /// The ratios held_over_median keeps: {metric: {str(rank): [ratio, ...]}}, the older first.
    fn held_state<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let b = lock(&self.buf)?;
        let out = PyDict::new_bound(py);
        for held in &b.held {
            let d = PyDict::new_bound(py);
            for (r, kept) in &held.ranks {
                d.set_item(r.to_string(), PyList::new_bound(py, kept))?;
            }
            out.set_item(b.names[held.metric].bind(py), d)?;
        }
        Ok(out)
    }

    /// Take back `held_state` (for the metrics a reader asked for).
    fn load_held(&self, py: Python<'_>, state: &Bound<'_, PyDict>) -> PyResult<()> {
        let mut b = lock(&self.buf)?;
        for (m, ranks) in state.iter() {
            let idx = b.name_index(py, m.downcast::<PyString>()?)?;
            let Some(h) = b.held.iter().position(|held| held.metric == idx) else { continue };
            let mut got = Held::new(idx);
            for (r, k) in ranks.downcast::<PyDict>()?.iter() {
                let rank = int_key(&r)?;
                let mut kept: Vec<f64> = Vec::new();
                for x in k.iter()? {
                    kept.push(x?.extract::<f64>()?);
                }
                let keep_from = kept.len().saturating_sub(HELD_POINTS - 1);
                *got.slot(rank) = kept.split_off(keep_from);     // (a rank twice: the last)
            }
            b.held[h] = got;
        }
        Ok(())
    }

    /// Take back `to_state` (what was pending replaces what is).
    fn load(&self, py: Python<'_>, state: &Bound<'_, PyDict>) -> PyResult<()> {
        let mut b = lock(&self.buf)?;
        let mut pending: Vec<Pending> = Vec::new();
        for (s, ranks) in state.iter() {
            let step = int_key(&s)?;
            let ranks = ranks.downcast::<PyDict>()?;
            let mut got: Vec<Entry> = Vec::new();
            for (r, e) in ranks.iter() {
                let rank = int_key(&r)?;
                let e = e.downcast::<PyDict>()?;
                let mut m = Vec::new();
                if let Some(md) = e.get_item("m")? {
                    for (k, v) in md.downcast::<PyDict>()?.iter() {
                        let i = b.name_index(py, k.downcast::<PyString>()?)?;
                        m.push((i, v.unbind()));
                    }
                }
                let h = match e.get_item("h")? {
                    Some(h) => h.unbind(),
                    None => PyDict::new_bound(py).into_any().unbind(),
                };
                let entry = Entry { rank, m, h: Hashes::Dict(h) };
                match got.iter().position(|x| x.rank == rank) {
                    Some(j) => got[j] = entry,
                    None => got.push(entry),
                }
            }
            match pending.iter().position(|p| p.step == step) {
                Some(j) => pending[j].ranks = got,
                None => pending.push(Pending { step, ranks: got }),
            }
        }
        b.pending = pending;
        b.close(py)
    }
}

#[derive(Clone, Copy)]
enum Stat {
    MaxOverMedian,
    Max,
    Median,
    HeldOverMedian,
}

/// `RankBuffer.rank_stat(metric, stat)`: called with no argument, `(value, rank or None)` of
/// the step at hand.
#[pyclass(module = "streams._native", frozen)]
pub struct RankStat {
    buf: Arc<Mutex<Buf>>,
    idx: usize,
    stat: Stat,
}

#[pymethods]
impl RankStat {
    fn __call__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        let none = py.None();
        if let Stat::HeldOverMedian = self.stat {
            return Ok(match lock(&self.buf)?.held_stat(py, self.idx)? {
                None => PyTuple::new_bound(py, [NAN.into_py(py), none]),
                Some((v, r)) => PyTuple::new_bound(py, [v.into_py(py), r.into_py(py)]),
            });
        }
        let got = lock(&self.buf)?.stat(py, self.idx)?;
        Ok(match got {
            None => PyTuple::new_bound(py, [NAN.into_py(py), none]),
            Some((top_value, top, med)) => match self.stat {
                Stat::Max => PyTuple::new_bound(py, [top_value.into_py(py), top.into_py(py)]),
                Stat::Median => PyTuple::new_bound(py, [med.into_py(py), none]),
                Stat::MaxOverMedian => {
                    PyTuple::new_bound(py, [ratio_pos(top_value, med).into_py(py), top.into_py(py)])
                }
                Stat::HeldOverMedian => unreachable!(),
            },
        })
    }
}

/// `RankBuffer.hash_mismatch(name)`: called with no argument, the ranks of the step at hand
/// whose hash `name` differs from rank 0's, sorted; None when rank 0 has none or fewer than
/// two ranks have one.
#[pyclass(module = "streams._native", frozen)]
pub struct HashMismatch {
    buf: Arc<Mutex<Buf>>,
    name: Py<PyString>,
}

/// One rank's hash: the object its dict holds, or its text in the bytes of the step read
/// natively.
enum Hash<'a, 'py> {
    Object(Bound<'py, PyAny>),
    Bytes(&'a [u8]),
}

impl Hash<'_, '_> {
    /// Python's `==` of the two hashes (a hash read natively is a str of printable ASCII).
    fn same(&self, other: &Hash<'_, '_>) -> PyResult<bool> {
        match (self, other) {
            (Hash::Bytes(a), Hash::Bytes(b)) => Ok(a == b),
            (Hash::Object(a), Hash::Object(b)) => a.eq(b),
            (Hash::Bytes(a), Hash::Object(o)) | (Hash::Object(o), Hash::Bytes(a)) => Ok(match o.downcast::<PyString>() {
                // (a str that is not UTF-8, with a lone surrogate, is not ASCII text either)
                Ok(s) => s.to_str().map_or(false, |t| t.as_bytes() == *a),
                Err(_) => false,
            }),
        }
    }
}

/// The hash `name` of a rank's entry, when it has one.
fn hash_of<'a, 'py>(py: Python<'py>, e: &'a Entry, name: &Bound<'py, PyString>, name_bytes: Option<&[u8]>) -> PyResult<Option<Hash<'a, 'py>>> {
    Ok(match &e.h {
        Hashes::Dict(d) => d.bind(py).downcast::<PyDict>()?.get_item(name)?.map(Hash::Object),
        Hashes::Read(ev) => name_bytes.and_then(|n| ev.get().hash_bytes(py, n)).map(Hash::Bytes),
    })
}

#[pymethods]
impl HashMismatch {
    fn __call__(&self, py: Python<'_>) -> PyResult<PyObject> {
        let b = lock(&self.buf)?;
        let name = self.name.bind(py);
        let name_bytes = name.to_str().ok().map(str::as_bytes);   // (None: no ASCII name)
        let first = b.current.iter().find(|e| e.rank == 0);
        let reference = match first {
            Some(e) => hash_of(py, e, name, name_bytes)?,
            None => None,
        };
        let reference = match reference {
            Some(Hash::Object(r)) if !r.is_none() => Hash::Object(r),
            Some(Hash::Bytes(r)) => Hash::Bytes(r),
            _ => return Ok(py.None()),
        };
        let mut differ: Vec<i64> = Vec::new();
        let mut seen = 0;
        for e in &b.current {
            let h = match hash_of(py, e, name, name_bytes)? {
                Some(Hash::Object(h)) if h.is_none() => continue,
                Some(h) => h,
                None => continue,
            };
            seen += 1;
            if !h.same(&reference)? {
                differ.push(e.rank);
            }
        }
        if seen < 2 {
            return Ok(py.None());
        }
        differ.sort();
        Ok(PyList::new_bound(py, differ).into_any().unbind())
    }
}
