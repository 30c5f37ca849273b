//! Per-step statistics of a step's per-sample arrays (`streams/run.py`: `spearman` and
//! `_Moments`), in Rust. The Python functions are the reference: the same operations in the
//! same order (plain left-to-right sums, as Python 3.11's `sum`), so the numbers are the same
//! bit for bit.

use pyo3::prelude::*;
use pyo3::types::PyList;
use std::cmp::Ordering;

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
    let mut order: Vec<usize> = (0..x.len()).collect();
    order.sort_by(|&a, &b| {
        // Python's sort asks `b < a` (is it smaller): equal values keep their order
        if x[a] < x[b] {
            Ordering::Less
        } else if x[b] < x[a] {
            Ordering::Greater
        } else {
            Ordering::Equal
        }
    });
    let mut r = vec![0i64; x.len()];
    for (rank, &i) in order.iter().enumerate() {
        r[i] = rank as i64;
    }
    r
}

/// Spearman's rank correlation of two per-sample arrays (streams.run.spearman).
#[pyfunction]
pub fn spearman(x: Vec<f64>, y: Vec<f64>) -> f64 {
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

/// The moments of one step's per-sample array (streams.run._Moments): ``(finite values or
/// None when all were finite, n, mean, m2, m3, m4)``; the moments are NaN when n is 0.
#[pyfunction]
pub fn moments(py: Python<'_>, xs: Vec<f64>) -> (Option<PyObject>, usize, f64, f64, f64, f64) {
    let mut s = psum(&xs);
    let mut kept: Option<Vec<f64>> = None;
    if !finite(s) {
        let f: Vec<f64> = xs.iter().copied().filter(|&x| finite(x)).collect();
        s = psum(&f);
        kept = Some(f);
    }
    let v: &[f64] = kept.as_deref().unwrap_or(&xs);
    let n = v.len();
    let (mut mean, mut m2, mut m3, mut m4) = (NAN, NAN, NAN, NAN);
    if n > 0 {
        let nf = n as f64;
        mean = s / nf;
        let (mut s2, mut s3, mut s4) = (0.0, 0.0, 0.0);
        for &x in v {
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
    (kept.map(|f| f.into_py(py)), n, mean, m2, m3, m4)
}

/// The least-squares slope per step of ``points`` (a list of ``[step, value]``), as
/// streams.run._ls_slope gives it for the steps and values: NaN under 3 points or when the
/// steps do not vary. Integer sums are exact, as Python's ints are.
#[pyfunction]
pub fn ls_slope_points(py: Python<'_>, points: &Bound<'_, PyList>) -> PyResult<f64> {
    let n = points.len();
    if n < 3 {
        return Ok(NAN);
    }
    let mut t: Vec<i128> = Vec::with_capacity(n);
    let mut d: Vec<f64> = Vec::with_capacity(n);
    let (mut t0, mut c) = (0i128, 0.0f64);
    for (i, p) in points.iter().enumerate() {
        let s: i64 = p.get_item(0)?.extract()?;
        let x: f64 = p.get_item(1)?.extract()?;
        if i == 0 {
            t0 = s as i128;
            c = x;
        }
        t.push(s as i128 - t0);
        d.push(x - c);
    }
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
