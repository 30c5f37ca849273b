//! Per-step statistics of a step's per-sample arrays (`streams/run.py`: `spearman` and
//! `_Moments`), in Rust. The Python functions are the reference: the same operations in the
//! same order (plain left-to-right sums, as Python 3.11's `sum`), so the numbers are the same
//! bit for bit.

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};
use std::cmp::Ordering;
use std::collections::VecDeque;

const NAN: f64 = f64::NAN;

#[inline]
fn finite(x: f64) -> bool {
    // Python's `x - x == 0.0`: false for NaN and the infinities
    x - x == 0.0
}

#[inline]
fn psum(xs: &[f64]) -> f64 {
    let mut s = 0.0;
    for &x in xs {
        s += x;
    }
    s
}

/// Python's `max(xs)` of floats without NaN: the first of the largest.
fn py_max(xs: &[f64]) -> f64 {
    let mut m = xs[0];
    for &x in &xs[1..] {
        if x > m {
            m = x;
        }
    }
    m
}

fn py_min(xs: &[f64]) -> f64 {
    let mut m = xs[0];
    for &x in &xs[1..] {
        if x < m {
            m = x;
        }
    }
    m
}

/// The rank of each value: its place in a stable sort (ties in order of appearance), as
/// `sorted(range(n), key=x.__getitem__)` gives them. The values are finite.
fn ranks(x: &[f64]) -> Vec<i64> {
    // sorted by (value, place): the order a stable sort of the values gives. Each finite value
    // becomes an integer in the same order (its bits, the sign flipped, or all flipped for a
    // negative one; -0.0 read as 0.0, which `<` finds equal), with its place below it: an
    // unstable sort of those integers (no two are equal) then needs no comparison closure,
    // and takes a third of the time for a batch of 64
    let mut order: Vec<u128> = x
        .iter()
        .enumerate()
        .map(|(i, &v)| {
            let bits = (v + 0.0).to_bits();
            let key = if bits >> 63 == 1 { !bits } else { bits | (1 << 63) };
            ((key as u128) << 32) | i as u128
        })
        .collect();
    order.sort_unstable();
    let mut r = vec![0i64; x.len()];
    for (rank, &k) in order.iter().enumerate() {
        r[(k as u32) as usize] = rank as i64;
    }
    r
}

/// The numbers of a per-sample array: a list read item by item as floats (PyO3's extraction of
/// a `Vec` goes through the sequence protocol, about twice the time for a list of 64), any
/// other sequence as PyO3 reads it.
pub struct Floats(Vec<f64>);

impl<'py> FromPyObject<'py> for Floats {
    fn extract_bound(obj: &Bound<'py, PyAny>) -> PyResult<Self> {
        if let Ok(list) = obj.downcast::<PyList>() {
            // the items in order, as long as the list is as long as it was at first (as PyO3's
            // iterator reads it: an item's `__float__` may shorten it); an exact float's
            // value read straight, what its extraction gives, any other item extracted
            let first = list.len();
            let mut v = Vec::with_capacity(first);
            let mut i = 0;
            while i < first.min(list.len()) {
                // SAFETY: `i` is within the list's current length, and the borrowed item is
                // read before anything else runs
                let item = unsafe { pyo3::ffi::PyList_GET_ITEM(list.as_ptr(), i as pyo3::ffi::Py_ssize_t) };
                if unsafe { pyo3::ffi::PyFloat_CheckExact(item) } != 0 {
                    v.push(unsafe { pyo3::ffi::PyFloat_AS_DOUBLE(item) });
                } else {
                    v.push(list.get_item(i)?.extract::<f64>()?);
                }
                i += 1;
            }
            Ok(Floats(v))
        } else {
            Ok(Floats(obj.extract()?))
        }
    }
}

/// Spearman's rank correlation of two per-sample arrays (streams.run.spearman).
#[pyfunction]
pub fn spearman(x: Floats, y: Floats) -> f64 {
    let (x, y) = (x.0, y.0);
    let mut n = x.len();
    if n != y.len() {
        return NAN;
    }
    let (sx, sy) = (psum(&x), psum(&y));
    let (x, y) = if !finite(sx) || !finite(sy) {
        let keep: Vec<usize> = (0..n).filter(|&i| finite(x[i]) && finite(y[i])).collect();
        n = keep.len();
        (keep.iter().map(|&i| x[i]).collect::<Vec<f64>>(), keep.iter().map(|&i| y[i]).collect())
    } else {
        (x, y)
    };
    if n < 3 || py_max(&x) == py_min(&x) || py_max(&y) == py_min(&y) {
        return NAN;
    }
    let (rx, ry) = (ranks(&x), ranks(&y));
    let mut d2: i64 = 0;
    for i in 0..n {
        let d = rx[i] - ry[i];
        d2 += d * d;
    }
    let nf = n as f64;
    let nn = (n * n) as f64;
    1.0 - 6.0 * (d2 as f64) / (nf * (nn - 1.0))
}

/// Python's float division: `ZeroDivisionError` for a zero divisor (any numerator), read as
/// NaN here as `_Moments.value` reads it.
#[inline]
fn pdiv(a: f64, b: f64) -> Option<f64> {
    if b == 0.0 {
        None
    } else {
        Some(a / b)
    }
}

/// Python's `x ** y` for floats: `OverflowError` when a finite base gives an infinite result
/// (read as NaN), else C's `pow`.
#[inline]
fn ppow(x: f64, y: f64) -> Option<f64> {
    let r = x.powf(y);
    if r.is_infinite() && x.is_finite() {
        None
    } else {
        Some(r)
    }
}

/// The statistics of one step's per-sample array (streams.run._Moments, the reference): the
/// finite values and their moments, computed once; `value(stat, cap)` reads one statistic.
#[pyclass(module = "streams._native")]
pub struct Moments {
    xs: Vec<f64>,
    #[pyo3(get)]
    n: usize,
    #[pyo3(get)]
    mean: f64,
    m2: f64,
    m3: f64,
    m4: f64,
    sorted: Option<Vec<f64>>,
}

impl Moments {
    /// The moments of a per-sample array (its NaN and infinities left out).
    pub(crate) fn of(xs: Floats) -> Self {
        let xs = xs.0;
        let mut s = psum(&xs);
        let xs = if finite(s) {
            xs
        } else {
            // a NaN or an infinity among the samples: leave them out
            let f: Vec<f64> = xs.into_iter().filter(|&x| finite(x)).collect();
            s = psum(&f);
            f
        };
        let n = xs.len();
        let (mut mean, mut m2, mut m3, mut m4) = (NAN, NAN, NAN, NAN);
        if n > 0 {
            let nf = n as f64;
            mean = s / nf;
            let (mut s2, mut s3, mut s4) = (0.0, 0.0, 0.0);
            for &x in &xs {
                let d = x - mean;
                let d2 = d * d;
                s2 += d2;
                s3 += d2 * d;
                s4 += d2 * d2;
            }
            m2 = s2 / nf;
            m3 = s3 / nf;
            m4 = s4 / nf;
        }
        Moments { xs, n, mean, m2, m3, m4, sorted: None }
    }

    fn shape(&self, skew_only: bool) -> Option<f64> {
        let n = self.n;
        let nf = n as f64;
        let g1 = pdiv(self.m3, ppow(self.m2, 1.5)?)? * (nf * (nf - 1.0)).sqrt();
        let g1 = pdiv(g1, nf - 2.0)?;
        if skew_only {
            return Some(g1);
        }
        if n < 4 {
            return Some(NAN);
        }
        let n1sq = ppow(nf - 1.0, 2.0)?;
        let den = (nf - 2.0) * (nf - 3.0);
        let g2 = pdiv(pdiv(((n * n) as f64 - 1.0) * self.m4, self.m2 * self.m2)? - 3.0 * n1sq, den)?;
        pdiv(g1 * g1 + 1.0, g2 + pdiv(3.0 * n1sq, den)?)
    }

    fn quantile(&mut self, q: f64) -> f64 {
        let n = self.n;
        if self.sorted.is_none() {
            let mut s = self.xs.clone();
            // a stable sort on `<`, as Python's sorted (equal values keep their order)
            s.sort_by(|a, b| {
                if a < b {
                    Ordering::Less
                } else if b < a {
                    Ordering::Greater
                } else {
                    Ordering::Equal
                }
            });
            self.sorted = Some(s);
        }
        let s = self.sorted.as_ref().unwrap();
        let pos = q * ((n - 1) as f64);
        let lo = pos as usize;
        let hi = (lo + 1).min(n - 1);
        s[lo] + (s[hi] - s[lo]) * (pos - lo as f64)
    }
}

#[pymethods]
impl Moments {
    #[new]
    fn new(xs: Floats) -> Self {
        Moments::of(xs)
    }

    /// The finite values, in order.
    #[getter]
    fn xs(&self) -> Vec<f64> {
        self.xs.clone()
    }

    #[pyo3(signature = (stat, cap))]
    pub(crate) fn value(&mut self, stat: &str, cap: Option<f64>) -> PyResult<f64> {
        let n = self.n;
        if n == 0 {
            return Ok(NAN);
        }
        let nf = n as f64;
        Ok(match stat {
            "mean" | "ratio_to_start" => self.mean,
            "std" => {
                if n > 1 {
                    (self.m2 * nf / (nf - 1.0)).sqrt()
                } else {
                    NAN
                }
            }
            "skewness" | "bimodality" => {
                if n < 3 || self.m2 <= 0.0 {
                    NAN
                } else {
                    self.shape(stat == "skewness").unwrap_or(NAN)
                }
            }
            "max" => py_max(&self.xs),
            "median" => self.quantile(0.5),
            "p99" => self.quantile(0.99),
            "tail_mass" | "frac_at_cap" => match cap {
                None => NAN,
                Some(c) => {
                    let count = if stat == "tail_mass" {
                        self.xs.iter().filter(|&&x| x > c).count()
                    } else {
                        self.xs.iter().filter(|&&x| x >= c).count()
                    };
                    count as f64 / nf
                }
            },
            // the share above ``cap`` times the step's median: a tail in the batch's own unit
            "tail_over_median" => match cap {
                None => NAN,
                Some(c) => {
                    let edge = c * self.quantile(0.5);
                    self.xs.iter().filter(|&&x| x > edge).count() as f64 / nf
                }
            },
            _ => {
                return Err(pyo3::exceptions::PyValueError::new_err(format!(
                    "unknown dist stat '{stat}'"
                )))
            }
        })
    }
}

/// The least-squares slope per step of the points ``(step, value)``, as streams.run._ls_slope
/// gives it: NaN under 3 points or when the steps do not vary. Integer sums are exact, as
/// Python's ints are.
fn ls_slope(py: Python<'_>, points: &VecDeque<(i64, f64)>) -> PyResult<f64> {
    let n = points.len();
    if n < 3 {
        return Ok(NAN);
    }
    let (t0, c) = (points[0].0 as i128, points[0].1);
    let t: Vec<i128> = points.iter().map(|&(s, _)| s as i128 - t0).collect();
    let d: Vec<f64> = points.iter().map(|&(_, x)| x - c).collect();
    let st1: i128 = t.iter().sum();
    let sd1 = psum(&d);
    let stt: i128 = t.iter().map(|&v| v * v).sum();
    let var = stt as f64 - super::int_truediv(py, st1 * st1, n as i128)?;
    if var <= 0.0 {
        return Ok(NAN);
    }
    let mut std = 0.0;
    for i in 0..n {
        std += (t[i] as f64) * d[i];
    }
    Ok((std - (st1 as f64) * sd1 / (n as f64)) / var)
}

/// The points ``[step, value]`` of one series of a group (a category, or the gap between the
/// categories), oldest first: streams.run.PySeries is the reference.
#[pyclass(module = "streams._native")]
pub struct Series {
    pts: VecDeque<(i64, f64)>,
}

#[pymethods]
impl Series {
    /// From ``[[step, value], ...]`` (lists or tuples), as ``to_list`` gives them.
    #[new]
    #[pyo3(signature = (points=None))]
    fn new(points: Option<&Bound<'_, PyAny>>) -> PyResult<Self> {
        let mut pts = VecDeque::new();
        if let Some(points) = points {
            for p in points.iter()? {
                let p = p?;
                let (s, x): (i64, f64) = match p.downcast::<PyList>() {
                    Ok(l) if l.len() == 2 => (l.get_item(0)?.extract()?, l.get_item(1)?.extract()?),
                    _ => p.extract()?,
                };
                pts.push_back((s, x));
            }
        }
        Ok(Series { pts })
    }

    fn append(&mut self, step: i64, value: f64) {
        self.pts.push_back((step, value));
    }

    /// Drop the oldest points whose step is at most ``edge``, keeping at least ``keep``.
    fn trim(&mut self, edge: i64, keep: usize) {
        while self.pts.len() > keep && self.pts[0].0 <= edge {
            self.pts.pop_front();
        }
    }

    fn __len__(&self) -> usize {
        self.pts.len()
    }

    /// Steps from the first point to the last, both counted; 0 when empty.
    fn span(&self) -> i64 {
        match (self.pts.front(), self.pts.back()) {
            (Some(a), Some(b)) => b.0 - a.0 + 1,
            _ => 0,
        }
    }

    /// The newest value; NaN when empty.
    fn last(&self) -> f64 {
        self.pts.back().map_or(NAN, |p| p.1)
    }

    fn slope(&self, py: Python<'_>) -> PyResult<f64> {
        ls_slope(py, &self.pts)
    }

    /// ``(sum of squares, count)`` of the second differences ``x[i] - 2 x[i-1] + x[i-2]`` of
    /// the points ``i`` whose step is above ``after`` (a straight trend gives 0: what is left
    /// is the series' scatter, 6 times its variance for independent noise).
    fn curvature(&self, after: i64) -> (f64, usize) {
        let (mut ss, mut n) = (0.0, 0);
        let pts = &self.pts;
        let mut i = pts.len();
        while i > 2 && pts[i - 1].0 > after {
            let d2 = pts[i - 1].1 - 2.0 * pts[i - 2].1 + pts[i - 3].1;
            ss += d2 * d2;
            n += 1;
            i -= 1;
        }
        (ss, n)
    }

    fn to_list<'py>(&self, py: Python<'py>) -> Bound<'py, PyList> {
        PyList::new_bound(py, self.pts.iter().map(|&(s, x)| PyList::new_bound(py, [s.into_py(py), x.into_py(py)])))
    }

    /// ``to_list()`` as MessagePack: the bytes msgspec writes for it (a worker writes a run's
    /// state without building these lists: they were half the time of writing a state).
    fn to_msgpack<'py>(&self, py: Python<'py>) -> Bound<'py, pyo3::types::PyBytes> {
        let mut mp = super::Mp(Vec::with_capacity(5 + self.pts.len() * 15));
        mp.array(self.pts.len());
        for &(s, x) in &self.pts {
            mp.array(2);
            mp.int(s);
            mp.float(x);
        }
        pyo3::types::PyBytes::new_bound(py, &mp.0)
    }
}

/// One step of a group metric's categories (`streams/run.py`: `py_update_group` is the
/// reference): every series of ``points`` (category -> Series) and ``gap`` loses its points at
/// or before ``edge`` (keeping at least ``keep``); each finite value of ``cats`` (category -> value)
/// joins its category's series (a new one while there are fewer than ``max_categories``); the
/// gap between the largest and the smallest finite value joins ``gap`` when there are two.
#[pyfunction]
pub fn update_group(
    py: Python<'_>,
    points: &Bound<'_, PyDict>,
    gap: &Bound<'_, Series>,
    cats: &Bound<'_, PyDict>,
    step: i64,
    edge: i64,
    max_categories: usize,
    keep: usize,
) -> PyResult<()> {
    for (_, series) in points.iter() {
        series.downcast::<Series>()?.borrow_mut().trim(edge, keep);
    }
    gap.borrow_mut().trim(edge, keep);
    let mut seen: Vec<f64> = Vec::with_capacity(cats.len());
    for (c, v) in cats.iter() {
        let v: f64 = v.extract()?;
        if !finite(v) {
            continue;
        }
        seen.push(v);
        match points.get_item(&c)? {
            Some(series) => series.downcast::<Series>()?.borrow_mut().append(step, v),
            None => {
                if points.len() >= max_categories {
                    continue;
                }
                let series = Bound::new(py, Series { pts: VecDeque::from([(step, v)]) })?;
                points.set_item(c, series)?;
            }
        }
    }
    if seen.len() >= 2 {
        gap.borrow_mut().append(step, py_max(&seen) - py_min(&seen));
    }
    Ok(())
}
