//! The signal bank of `streams/signals.py` (`Bank`, with its tracks, windows and readers) in
//! Rust, as the Python extension module `streams._native`.
//!
//! The Python classes in `streams/signals.py` are the reference: every number this module
//! gives must be bit for bit the one they give. So every float operation below is done in the
//! order the Python does it, with Python's rules:
//!
//! * `sum` of floats is a plain left-to-right double sum starting from 0.0 (Python 3.11);
//! * `x ** n` is CPython's `float_pow` (its special cases, then the C library's `pow`, and an
//!   OverflowError when the result overflows): see [`py_pow`];
//! * `max(a, b)` / `min(a, b)` keep the first argument unless the second compares greater /
//!   smaller (what they do with NaN follows from that);
//! * a float division by zero raises ZeroDivisionError, as in Python;
//! * int / int is correctly rounded (Python's true division of ints);
//! * `sorted` of a list holding a NaN is done by Python's own sort (its result depends on the
//!   algorithm); otherwise a stable sort, which gives the same list as Python's;
//! * `bisect` and `insort` are Python's algorithms, so equal values (0.0 and -0.0) land where
//!   Python puts them.
//!
//! `autocorr` included: `streams.signals._autocorr` is a plain loop, in the order of [`autocorr`].

use pyo3::exceptions::{
    PyIndexError, PyOverflowError, PyRuntimeError, PyTypeError, PyValueError, PyZeroDivisionError,
};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyFloat, PyList, PyString, PyTuple};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::hint::black_box;
use std::sync::{Arc, Mutex, MutexGuard};

mod dists;
mod logic;
mod ranks;
mod routine;
mod text;
mod view;
mod wire;

const NAN: f64 = f64::NAN;
const INF: f64 = f64::INFINITY;
const LEVEL_STEPS: i64 = 5;
const LEVEL_POINTS: i64 = 3;
const BASELINE_POINTS: usize = 3;
/// An EMA over N steps averages at least the points a run logged every EMA_POINT_STEPS steps
/// has in N steps (streams/signals.py: ema_floor).
const EMA_POINT_STEPS: f64 = 20.0;
const MAD_SCALE: f64 = 1.4826;
const SPLIT_REF_POINTS: i64 = 12;
/// the fewest points of each block jump_t compares (streams.signals.JUMP_BLOCK_POINTS)
const JUMP_BLOCK_POINTS: i64 = 6;
/// the steps of a run's start whose median shift_gain measures the run's gain from
const START_STEPS: i64 = 20;
/// a metric first logged after this step was first watched mid-training
/// (streams.signals.RESUMED_AFTER_STEP)
const RESUMED_AFTER_STEP: i64 = 40;
/// the least share of such a start's level the gain signals count as its gain
/// (streams.signals.RESUMED_LEVEL_SHARE)
const RESUMED_LEVEL_SHARE: f64 = 0.5;
const MEAN_AD_SCALE: f64 = 1.2533;

// -- Python's arithmetic -----------------------------------------------------------------------

/// Python's ``min(a, b)``: ``b`` only when it is smaller (``a`` on a tie or a NaN).
#[inline]
fn py_min(a: f64, b: f64) -> f64 {
    if b < a {
        b
    } else {
        a
    }
}

/// Python's ``max(a, b)``: ``b`` only when it is larger (``a`` on a tie or a NaN).
#[inline]
fn py_max(a: f64, b: f64) -> f64 {
    if b > a {
        b
    } else {
        a
    }
}

/// The least decay per logged point of an EMA of `span` steps (0 for spans of at most
/// EMA_POINT_STEPS steps).
fn ema_floor(span: i64) -> f64 {
    let points = span as f64 / EMA_POINT_STEPS;
    if points > 1.0 {
        1.0 - 2.0 / (points + 1.0)
    } else {
        0.0
    }
}

#[inline]
fn fdiv(a: f64, b: f64) -> PyResult<f64> {
    if b == 0.0 {
        Err(PyZeroDivisionError::new_err("float division by zero"))
    } else {
        Ok(a / b)
    }
}

/// Python 3.11's builtin `sum` of floats.
#[inline]
fn psum<I: IntoIterator<Item = f64>>(it: I) -> f64 {
    let mut s = 0.0;
    for x in it {
        s += x;
    }
    s
}

/// Python's int / int (correctly rounded).
fn int_truediv(py: Python<'_>, a: i128, b: i128) -> PyResult<f64> {
    const LIM: i128 = 1 << 53;
    if b == 0 {
        return Err(PyZeroDivisionError::new_err("division by zero"));
    }
    if a.abs() <= LIM && b.abs() <= LIM {
        return Ok(a as f64 / b as f64);
    }
    let a = a.into_py(py).into_bound(py);
    a.div(b)?.extract()
}

extern "C" {
    #[link_name = "pow"]
    fn c_pow(x: f64, y: f64) -> f64;
}

#[cfg(any(target_os = "linux", target_os = "android"))]
unsafe fn errno_ptr() -> *mut libc::c_int {
    libc::__errno_location()
}
#[cfg(any(target_os = "macos", target_os = "ios", target_os = "freebsd"))]
unsafe fn errno_ptr() -> *mut libc::c_int {
    libc::__error()
}
#[cfg(not(any(
    target_os = "linux",
    target_os = "android",
    target_os = "macos",
    target_os = "ios",
    target_os = "freebsd"
)))]
unsafe fn errno_ptr() -> *mut libc::c_int {
    static mut E: libc::c_int = 0;
    std::ptr::addr_of_mut!(E)
}

#[inline]
fn is_odd_integer(w: f64) -> bool {
    w.abs() % 2.0 == 1.0
}

/// CPython 3.11's `float ** float` (Objects/floatobject.c, float_pow).
fn py_pow(iv: f64, iw: f64) -> PyResult<f64> {
    if iw == 0.0 {
        return Ok(1.0);
    }
    if iw == 1.0 {
        return Ok(iv); // x ** 1 is x, for every x (the EMAs' decay over a gap of one step)
    }
    if iv.is_nan() {
        return Ok(iv);
    }
    if iw.is_nan() {
        return Ok(if iv == 1.0 { 1.0 } else { iw });
    }
    if iw.is_infinite() {
        let a = iv.abs();
        return Ok(if a == 1.0 {
            1.0
        } else if (iw > 0.0) == (a > 1.0) {
            iw.abs()
        } else {
            0.0
        });
    }
    if iv.is_infinite() {
        let odd = is_odd_integer(iw);
        return Ok(if iw > 0.0 {
            if odd {
                iv
            } else {
                iv.abs()
            }
        } else if odd {
            0.0f64.copysign(iv)
        } else {
            0.0
        });
    }
    if iv == 0.0 {
        if iw < 0.0 {
            return Err(PyZeroDivisionError::new_err(
                "0.0 cannot be raised to a negative power",
            ));
        }
        return Ok(if is_odd_integer(iw) { iv } else { 0.0 });
    }
    let mut v = iv;
    let mut negate = false;
    if v < 0.0 {
        if iw != iw.floor() {
            return Err(PyValueError::new_err(
                "a negative number to a fractional power (complex in Python)",
            ));
        }
        v = -v;
        negate = is_odd_integer(iw);
    }
    if v == 1.0 {
        return Ok(if negate { -1.0 } else { 1.0 });
    }
    let (mut ix, mut err) = unsafe {
        let e = errno_ptr();
        *e = 0;
        let r = c_pow(black_box(v), black_box(iw));
        (r, *e)
    };
    if err == 0 {
        if ix.is_infinite() {
            err = libc::ERANGE;
        }
    } else if err == libc::ERANGE && ix == 0.0 {
        err = 0;
    }
    if negate {
        ix = -ix;
    }
    if err != 0 {
        if err == libc::ERANGE {
            return Err(PyOverflowError::new_err((34, "Numerical result out of range")));
        }
        return Err(PyValueError::new_err("math domain error"));
    }
    Ok(ix)
}

/// Python's `sorted` of a list of floats.
fn sorted(py: Python<'_>, mut v: Vec<f64>) -> PyResult<Vec<f64>> {
    if v.iter().any(|x| x.is_nan()) {
        let l = PyList::new_bound(py, &v);
        l.sort()?;
        return l.extract();
    }
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    Ok(v)
}

#[inline]
fn bisect_left(a: &[f64], x: f64, mut lo: usize) -> usize {
    let mut hi = a.len();
    while lo < hi {
        let mid = (lo + hi) / 2;
        if a[mid] < x {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    lo
}

/// The places in `srt` (sorted) of the values of `gone` (sorted, each among them), ascending,
/// into `out`: where removing each of `gone` at `bisect_left` (the first of the values equal
/// to it, after the place of the one before) takes it from; false if one is not there.
fn places_of(srt: &[f64], gone: &[f64], out: &mut Vec<usize>) -> bool {
    out.clear();
    let mut lo = 0;
    for &g in gone {
        let p = bisect_left(srt, g, lo);
        if p >= srt.len() || srt[p] != g {
            return false;
        }
        out.push(p);
        lo = p + 1;
    }
    true
}

/// The place in a sorted slice of its `m`-th value once the values at `gone` (ascending
/// places) are left out.
#[inline]
fn skipping(gone: &[usize], m: usize) -> usize {
    let mut at = m;
    for &p in gone {
        if p <= at {
            at += 1;
        } else {
            break;
        }
    }
    at
}

/// `srt` without the values at places `gone` (ascending), into `out` (emptied first), the
/// values between copied in runs.
fn without_places(srt: &[f64], gone: &[usize], out: &mut Vec<f64>) {
    out.clear();
    out.reserve(srt.len().saturating_sub(gone.len()));
    let mut lo = 0;
    for &p in gone {
        out.extend_from_slice(&srt[lo..p]);
        lo = p + 1;
    }
    out.extend_from_slice(&srt[lo..]);
}

/// `srt.remove(lo)` then `srt.insert(bisect_right(srt, x, 0), x)`, with one shift of the
/// values between the two places instead of one of all those after each.
fn replace_sorted(srt: &mut [f64], lo: usize, x: f64) {
    let p = bisect_right(srt, x, 0);
    // the place bisect_right finds once the value at `lo` is gone
    let at = if p > lo { p - 1 } else { p };
    if at > lo {
        srt.copy_within(lo + 1..at + 1, lo);
    } else if at < lo {
        srt.copy_within(at..lo, at + 1);
    }
    srt[at] = x;
}

#[inline]
fn bisect_right(a: &[f64], x: f64, mut lo: usize) -> usize {
    let mut hi = a.len();
    while lo < hi {
        let mid = (lo + hi) / 2;
        if x < a[mid] {
            hi = mid;
        } else {
            lo = mid + 1;
        }
    }
    lo
}

fn index_error() -> PyErr {
    PyIndexError::new_err("index out of range")
}

#[inline]
fn first(a: &[f64]) -> PyResult<f64> {
    a.first().copied().ok_or_else(index_error)
}

#[inline]
fn last(a: &[f64]) -> PyResult<f64> {
    a.last().copied().ok_or_else(index_error)
}

#[inline]
fn dq_last<T: Copy>(a: &VecDeque<T>) -> PyResult<T> {
    a.back().copied().ok_or_else(index_error)
}

// -- the pure functions of signals.py ----------------------------------------------------------

pub(crate) fn median_of(s: &[f64]) -> f64 {
    let n = s.len();
    if n == 0 {
        return NAN;
    }
    let h = n / 2;
    if n % 2 == 1 {
        s[h]
    } else {
        0.5 * (s[h - 1] + s[h])
    }
}

/// `median_of(&sorted(py, v))` without sorting: the middle values found by selection (linear
/// time), the same numbers. Only for values whose median is used as a magnitude or as the
/// center of absolute deviations: among equal values of opposite zero sign, selection may pick
/// the other zero (the sort keeps them in the order they came). NaNs take the sort (Python's
/// order of NaNs).
fn median_selected(py: Python<'_>, mut v: Vec<f64>) -> PyResult<f64> {
    let n = v.len();
    if n == 0 {
        return Ok(NAN);
    }
    if v.iter().any(|x| x.is_nan()) {
        return Ok(median_of(&sorted(py, v)?));
    }
    let h = n / 2;
    let (left, mid, _) = v.select_nth_unstable_by(h, |a, b| a.partial_cmp(b).unwrap());
    let m = *mid;
    if n % 2 == 1 {
        return Ok(m);
    }
    // the largest of the values before the middle one: the sort's v[h - 1]
    let below = left.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    Ok(0.5 * (below + m))
}

fn robust_scale(py: Python<'_>, values: &[f64], med: f64) -> PyResult<f64> {
    let dev: Vec<f64> = values.iter().map(|v| (v - med).abs()).collect();
    if dev.is_empty() {
        return Ok(NAN);
    }
    let n = dev.len() as f64;
    let total = psum(dev.iter().copied());
    // the data's resolution: the smallest deviation that is not 0 (Python's min, in order: a
    // NaN kept only when it comes first)
    let mut quantum: Option<f64> = None;
    for &x in &dev {
        if x != 0.0 {
            match quantum {
                None => quantum = Some(x),
                Some(q) if x < q => quantum = Some(x),
                _ => {}
            }
        }
    }
    let scale = py_max(MAD_SCALE * median_selected(py, dev)?, MEAN_AD_SCALE * total / n);
    Ok(py_max(scale, quantum.unwrap_or(0.0)))
}

/// `robust_scale(py, srt, med)` of sorted values: the median absolute deviation found by
/// walking out from `med` on both sides (the deviations of sorted values come in order on each
/// side: rounding keeps `|x - med|` monotone), without a vector or a sort. The same number.
fn robust_scale_sorted(py: Python<'_>, srt: &[f64], med: f64) -> PyResult<f64> {
    let n = srt.len();
    if n == 0 || !med.is_finite() || srt.iter().any(|x| x.is_nan()) {
        return robust_scale(py, srt, med);
    }
    let total = psum(srt.iter().map(|v| (v - med).abs()));
    // deviations below `med` (walking down from p - 1) and from it up (walking up from p)
    let p = srt.partition_point(|x| *x < med);
    let (mut i, mut j) = (p, p);
    let h = n / 2;
    let mut prev = NAN;
    let mut cur = NAN;
    for _ in 0..=h {
        let down = if i > 0 { (srt[i - 1] - med).abs() } else { f64::INFINITY };
        let up = if j < n { (srt[j] - med).abs() } else { f64::INFINITY };
        prev = cur;
        if i > 0 && (j >= n || down <= up) {
            cur = down;
            i -= 1;
        } else {
            cur = up;
            j += 1;
        }
    }
    let mad = if n % 2 == 1 { cur } else { 0.5 * (prev + cur) };
    // the smallest deviation that is not 0: the nearest value under `med` or over it
    let over = srt.partition_point(|x| *x <= med);
    let mut quantum = 0.0;
    if p > 0 {
        quantum = (srt[p - 1] - med).abs();
    }
    if over < n {
        let d = (srt[over] - med).abs();
        if p == 0 || d < quantum {
            quantum = d;
        }
    }
    Ok(py_max(py_max(MAD_SCALE * mad, MEAN_AD_SCALE * total / n as f64), quantum))
}

fn diff_scale(py: Python<'_>, v: &[f64]) -> PyResult<f64> {
    let d: Vec<f64> = v.windows(2).map(|w| w[1] - w[0]).collect();
    if d.len() < 2 {
        return Ok(NAN);
    }
    // the median is only the center of the absolute deviations
    let center = median_selected(py, d.clone())?;
    robust_scale(py, &d, center)
}

/// (median, robust scale, points, maximum, robust scale of the changes) of a run's first points.
fn frozen_baseline(py: Python<'_>, pts: &[f64]) -> PyResult<Vec<f64>> {
    let srt = sorted(py, pts.to_vec())?;
    let med = median_of(&srt);
    let scale = robust_scale(py, &srt, med)?;
    let top = last(&srt)?;
    Ok(vec![med, scale, srt.len() as f64, top, diff_scale(py, pts)?])
}

/// The sample standard deviation of `v` (two passes, summed in order: streams.signals).
fn sample_std(v: &[f64]) -> f64 {
    let m = v.len() as f64;
    let mut c = 0.0;
    for &x in v {
        c += x;
    }
    c /= m;
    let mut s = 0.0;
    for &x in v {
        s += (x - c) * (x - c);
    }
    (s / (m - 1.0)).sqrt()
}

/// The sum of `v` without its lowest and highest value (in sorted order).
fn trimmed_sum(py: Python<'_>, v: Vec<f64>) -> PyResult<f64> {
    let srt = sorted(py, v)?;
    let mut t = 0.0;
    if srt.len() > 2 {
        for &x in &srt[1..srt.len() - 1] {
            t += x;
        }
    }
    Ok(t)
}

fn zscore(x: f64, center: f64, scale: f64) -> f64 {
    if x.is_nan() || center.is_nan() || scale.is_nan() {
        return NAN;
    }
    let floor = 1e-9 * center.abs();
    if scale > floor {
        return (x - center) / scale;
    }
    let d = x - center;
    if d.abs() <= floor {
        return 0.0;
    }
    INF.copysign(d)
}

fn ratio(x: f64, base: f64) -> f64 {
    if base.is_nan() {
        return NAN;
    }
    if base == 0.0 {
        return if x > 0.0 {
            INF
        } else if x == 0.0 {
            1.0
        } else {
            -INF
        };
    }
    x / base
}

fn enc(py: Python<'_>, x: f64) -> PyObject {
    if x.is_nan() {
        py.None()
    } else if x.is_infinite() {
        (if x > 0.0 { "inf" } else { "-inf" }).into_py(py)
    } else {
        x.into_py(py)
    }
}

/// A MessagePack writer that spells each value exactly as msgspec spells the Python value the
/// `to_state` methods build for it (the smallest integer form, float64 for every float, str8
/// for strings of 32-255 bytes), so that `Bank.to_msgpack()` is byte for byte
/// `msgspec.msgpack.encode(bank.to_state())`.
struct Mp(Vec<u8>);

impl Mp {
    fn nil(&mut self) {
        self.0.push(0xc0);
    }

    fn int(&mut self, x: i64) {
        let b = &mut self.0;
        if x < 0 {
            if x < -(1i64 << 31) {
                b.push(0xd3);
                b.extend_from_slice(&x.to_be_bytes());
            } else if x < -(1i64 << 15) {
                b.push(0xd2);
                b.extend_from_slice(&(x as i32).to_be_bytes());
            } else if x < -(1i64 << 7) {
                b.push(0xd1);
                b.extend_from_slice(&(x as i16).to_be_bytes());
            } else if x < -(1i64 << 5) {
                b.push(0xd0);
                b.push(x as i8 as u8);
            } else {
                b.push(x as i8 as u8);
            }
        } else if x < (1 << 7) {
            b.push(x as u8);
        } else if x < (1 << 8) {
            b.push(0xcc);
            b.push(x as u8);
        } else if x < (1 << 16) {
            b.push(0xcd);
            b.extend_from_slice(&(x as u16).to_be_bytes());
        } else if x < (1i64 << 32) {
            b.push(0xce);
            b.extend_from_slice(&(x as u32).to_be_bytes());
        } else {
            b.push(0xcf);
            b.extend_from_slice(&(x as u64).to_be_bytes());
        }
    }

    fn opt_int(&mut self, x: Option<i64>) {
        match x {
            Some(v) => self.int(v),
            None => self.nil(),
        }
    }

    fn float(&mut self, x: f64) {
        self.0.push(0xcb);
        self.0.extend_from_slice(&x.to_bits().to_be_bytes());
    }

    /// A float as `enc` gives it to Python: None for NaN, "inf"/"-inf" for the infinities.
    fn enc(&mut self, x: f64) {
        if x.is_nan() {
            self.nil();
        } else if x.is_infinite() {
            self.str(if x > 0.0 { "inf" } else { "-inf" });
        } else {
            self.float(x);
        }
    }

    fn head(&mut self, n: usize, fix: u8, fix_max: usize, b16: u8, b32: u8) {
        let b = &mut self.0;
        if n < fix_max {
            b.push(fix | n as u8);
        } else if n < (1 << 16) {
            b.push(b16);
            b.extend_from_slice(&(n as u16).to_be_bytes());
        } else {
            b.push(b32);
            b.extend_from_slice(&(n as u32).to_be_bytes());
        }
    }

    fn str(&mut self, s: &str) {
        let n = s.len();
        if n >= 32 && n < 256 {
            self.0.push(0xd9);
            self.0.push(n as u8);
        } else {
            self.head(n, 0xa0, 32, 0xda, 0xdb);
        }
        self.0.extend_from_slice(s.as_bytes());
    }

    fn array(&mut self, n: usize) {
        self.head(n, 0x90, 16, 0xdc, 0xdd);
    }

    fn map(&mut self, n: usize) {
        self.head(n, 0x80, 16, 0xde, 0xdf);
    }
}

fn dec(x: &Bound<'_, PyAny>) -> PyResult<f64> {
    if x.is_none() {
        return Ok(NAN);
    }
    if let Ok(f) = x.downcast::<PyFloat>() {
        return Ok(f.value());
    }
    x.py().get_type_bound::<PyFloat>().call1((x,))?.extract()
}

/// A step, a count: a Python int (None for Option).
fn opt_i64(x: &Bound<'_, PyAny>) -> PyResult<Option<i64>> {
    if x.is_none() {
        Ok(None)
    } else {
        Ok(Some(x.extract()?))
    }
}

/// A `smooth` of a state's track key: None, an int (or a float holding an int, as Python's
/// tuple comparison would match it).
fn key_smooth(x: &Bound<'_, PyAny>) -> Option<Option<i64>> {
    if x.is_none() {
        return Some(None);
    }
    if let Ok(i) = x.extract::<i64>() {
        return Some(Some(i));
    }
    if let Ok(f) = x.extract::<f64>() {
        if f == f.trunc() && f.abs() < 9e15 {
            return Some(Some(f as i64));
        }
    }
    None
}

// -- Track ------------------------------------------------------------------------------------

#[derive(Clone)]
enum Baseline {
    /// the run's first points, until the baseline is known
    Collecting(Vec<f64>),
    /// (median, scale, points, maximum, change scale): `count_int` while the points are the
    /// int Python's `len` gave (a loaded state holds them as a float, as Python's `_dec` does)
    Frozen { v: Vec<f64>, count_int: bool },
}

struct Track {
    metric: String,
    smooth: Option<i64>,
    keep_steps: i64,
    keep_points: i64,
    steps: VecDeque<i64>,
    values: VecDeque<f64>,
    total: i64,
    first_step: Option<i64>,
    n: i64,
    last_step: Option<i64>,
    cur: f64,
    alpha: f64,
    floor: f64,
    num: f64,
    den: f64,
    prev_step: Option<i64>,
    baselines: Vec<(i64, Baseline)>,
    ema_spans: Vec<i64>,
    emas: Vec<(i64, [f64; 2])>,
}

impl Track {
    fn new(metric: String, smooth: Option<i64>) -> PyResult<Track> {
        let alpha = match smooth {
            Some(s) if s != 0 => fdiv(2.0, s as f64 + 1.0)?,
            _ => 0.0,
        };
        let floor = match smooth {
            Some(s) if s != 0 => ema_floor(s),
            _ => 0.0,
        };
        Ok(Track {
            metric,
            smooth,
            keep_steps: 1,
            keep_points: 1,
            steps: VecDeque::new(),
            values: VecDeque::new(),
            total: 0,
            first_step: None,
            n: 0,
            last_step: None,
            cur: NAN,
            alpha,
            floor,
            num: 0.0,
            den: 0.0,
            prev_step: None,
            baselines: Vec::new(),
            ema_spans: Vec::new(),
            emas: Vec::new(),
        })
    }

    fn smoothed_flag(&self) -> bool {
        matches!(self.smooth, Some(s) if s != 0)
    }

    fn need(&mut self, steps: i64, points: i64) {
        self.keep_steps = self.keep_steps.max(steps);
        self.keep_points = self.keep_points.max(points);
    }

    fn push(&mut self, py: Python<'_>, step: i64, x0: f64) -> PyResult<()> {
        self.last_step = Some(step);
        self.cur = x0;
        if x0 - x0 != 0.0 {
            return Ok(());
        }
        let mut x = x0;
        let gap = match self.prev_step {
            None => 1,
            Some(p) if step - p <= 1 => 1,
            Some(p) => step - p,
        };
        self.prev_step = Some(step);
        if self.first_step.is_none() {
            self.first_step = Some(step);
        }
        self.n += 1;
        if !self.ema_spans.is_empty() {
            for i in 0..self.ema_spans.len() {
                let span = self.ema_spans[i];
                let j = match self.emas.iter().position(|(s, _)| *s == span) {
                    Some(j) => j,
                    None => {
                        self.emas.push((span, [0.0, 0.0]));
                        self.emas.len() - 1
                    }
                };
                let mut decay = py_pow(1.0 - fdiv(2.0, span as f64 + 1.0)?, gap as f64)?;
                if gap > 1 {
                    decay = decay.max(ema_floor(span));
                }
                let e = &mut self.emas[j].1;
                e[0] = decay * e[0] + (1.0 - decay) * x;
                e[1] = decay * e[1] + (1.0 - decay);
            }
        }
        if self.alpha != 0.0 {
            let decay = if gap == 1 {
                1.0 - self.alpha
            } else {
                py_pow(1.0 - self.alpha, gap as f64)?.max(self.floor)
            };
            self.num = decay * self.num + (1.0 - decay) * x;
            self.den = decay * self.den + (1.0 - decay);
            x = fdiv(self.num, self.den)?;
        }
        if !self.baselines.is_empty() {
            let first = self.first_step.unwrap();
            for (window, b) in self.baselines.iter_mut() {
                if let Baseline::Collecting(pts) = b {
                    if step < first + *window || pts.len() < BASELINE_POINTS {
                        pts.push(x);
                    } else {
                        let v = frozen_baseline(py, pts)?;
                        *b = Baseline::Frozen { v, count_int: true };
                    }
                }
            }
        }
        self.steps.push_back(step);
        self.values.push_back(x);
        self.total += 1;
        let keep = self.keep_points;
        if self.steps.len() as i64 > keep && self.steps[0] <= step - self.keep_steps {
            let edge = step - self.keep_steps;
            while self.steps.len() as i64 > keep && self.steps[0] <= edge {
                self.steps.pop_front();
                self.values.pop_front();
            }
        }
        Ok(())
    }

    fn ema(&self, span: i64) -> f64 {
        match self.emas.iter().find(|(s, _)| *s == span) {
            Some((_, e)) if e[1] > 0.0 => e[0] / e[1],
            _ => NAN,
        }
    }

    fn smoothed(&self) -> f64 {
        if self.den > 0.0 {
            self.num / self.den
        } else {
            NAN
        }
    }

    fn baseline_stat(&self, window: i64, i: usize) -> f64 {
        for (w, b) in &self.baselines {
            if *w == window {
                if let Baseline::Frozen { v, .. } = b {
                    if v.len() > i {
                        return v[i];
                    }
                }
                return NAN;
            }
        }
        NAN
    }

    fn baseline(&self, window: i64) -> f64 {
        self.baseline_stat(window, 0)
    }

    /// The unit of the gain signals at the level `r` (streams.signals.Track.gain_unit): what
    /// the metric moved from its start to `r` plus that start's robust scale; for a metric
    /// first watched mid-training, at least RESUMED_LEVEL_SHARE of its start's level.
    fn gain_unit(&self, r: f64) -> f64 {
        let start = self.baseline(START_STEPS);
        let unit = (r - start).abs() + self.baseline_stat(START_STEPS, 1);
        if let Some(first) = self.first_step {
            if first > RESUMED_AFTER_STEP {
                let floor = RESUMED_LEVEL_SHARE * start.abs();
                if floor > unit {
                    return floor;
                }
            }
        }
        unit
    }

    fn to_state(&self, py: Python<'_>) -> PyResult<PyObject> {
        let d = PyDict::new_bound(py);
        d.set_item("steps", PyList::new_bound(py, self.steps.iter()))?;
        d.set_item(
            "values",
            PyList::new_bound(py, self.values.iter().map(|v| enc(py, *v))),
        )?;
        d.set_item("total", self.total)?;
        d.set_item("first", self.first_step)?;
        d.set_item("n", self.n)?;
        d.set_item("last", self.last_step)?;
        d.set_item("cur", enc(py, self.cur))?;
        d.set_item("num", self.num)?;
        d.set_item("den", self.den)?;
        d.set_item("prev", self.prev_step)?;
        let base = PyDict::new_bound(py);
        for (w, b) in &self.baselines {
            let p: PyObject = match b {
                Baseline::Collecting(pts) => PyList::new_bound(py, pts.iter()).into_py(py),
                Baseline::Frozen { v, count_int } => {
                    let e = PyDict::new_bound(py);
                    e.set_item("m", v[0])?;
                    let s = PyList::empty_bound(py);
                    for (i, x) in v.iter().enumerate().skip(1) {
                        if i == 2 && *count_int {
                            s.append(*x as i64)?;
                        } else {
                            s.append(enc(py, *x))?;
                        }
                    }
                    e.set_item("s", s)?;
                    PyList::new_bound(py, [e]).into_py(py)
                }
            };
            base.set_item(w.to_string(), p)?;
        }
        d.set_item("base", base)?;
        let emas = PyDict::new_bound(py);
        for (k, e) in &self.emas {
            emas.set_item(k.to_string(), PyList::new_bound(py, e.iter()))?;
        }
        d.set_item("emas", emas)?;
        Ok(d.into_py(py))
    }

    /// What `to_state` gives, as MessagePack (see `Mp`).
    fn to_msgpack(&self, mp: &mut Mp) {
        mp.map(12);
        mp.str("steps");
        mp.array(self.steps.len());
        for s in &self.steps {
            mp.int(*s);
        }
        mp.str("values");
        mp.array(self.values.len());
        for v in &self.values {
            mp.enc(*v);
        }
        mp.str("total");
        mp.int(self.total);
        mp.str("first");
        mp.opt_int(self.first_step);
        mp.str("n");
        mp.int(self.n);
        mp.str("last");
        mp.opt_int(self.last_step);
        mp.str("cur");
        mp.enc(self.cur);
        mp.str("num");
        mp.float(self.num);
        mp.str("den");
        mp.float(self.den);
        mp.str("prev");
        mp.opt_int(self.prev_step);
        mp.str("base");
        mp.map(self.baselines.len());
        for (w, b) in &self.baselines {
            mp.str(&w.to_string());
            match b {
                Baseline::Collecting(pts) => {
                    mp.array(pts.len());
                    for p in pts {
                        mp.float(*p);
                    }
                }
                Baseline::Frozen { v, count_int } => {
                    mp.array(1);
                    mp.map(2);
                    mp.str("m");
                    mp.float(v[0]);
                    mp.str("s");
                    mp.array(v.len().saturating_sub(1));
                    for (i, x) in v.iter().enumerate().skip(1) {
                        if i == 2 && *count_int {
                            mp.int(*x as i64);
                        } else {
                            mp.enc(*x);
                        }
                    }
                }
            }
        }
        mp.str("emas");
        mp.map(self.emas.len());
        for (k, e) in &self.emas {
            mp.str(&k.to_string());
            mp.array(e.len());
            for x in e {
                mp.float(*x);
            }
        }
    }

    fn load(&mut self, st: &Bound<'_, PyAny>) -> PyResult<()> {
        let steps: Vec<i64> = st.get_item("steps")?.extract()?;
        let mut values = VecDeque::new();
        for v in st.get_item("values")?.iter()? {
            values.push_back(dec(&v?)?);
        }
        self.steps = steps.into_iter().collect();
        self.values = values;
        self.total = st.get_item("total")?.extract()?;
        self.first_step = opt_i64(&st.get_item("first")?)?;
        self.n = st.get_item("n")?.extract()?;
        self.last_step = opt_i64(&st.get_item("last")?)?;
        self.cur = dec(&st.get_item("cur")?)?;
        self.num = st.get_item("num")?.extract()?;
        self.den = st.get_item("den")?.extract()?;
        self.prev_step = opt_i64(&st.get_item("prev")?)?;
        if let Some(base) = st.call_method1("get", ("base",))?.downcast::<PyDict>().ok() {
            for (w, p) in base.iter() {
                let w: i64 = w.str()?.to_str()?.trim().parse().map_err(|_| {
                    PyValueError::new_err("a baseline's window is not an int")
                })?;
                let Some(slot) = self.baselines.iter_mut().find(|(k, _)| *k == w) else {
                    continue;
                };
                let n = p.len()?;
                let first = if n == 1 { Some(p.get_item(0)?) } else { None };
                slot.1 = match first {
                    Some(e) if e.is_instance_of::<PyDict>() => {
                        let e = e.downcast::<PyDict>()?;
                        let m = e.get_item("m")?.ok_or_else(|| PyValueError::new_err("m"))?;
                        let mut v = vec![dec(&m)?];
                        if let Some(s) = e.get_item("s")? {
                            for x in s.iter()? {
                                v.push(dec(&x?)?);
                            }
                        }
                        Baseline::Frozen { v, count_int: false }
                    }
                    _ => {
                        let mut pts = Vec::with_capacity(n);
                        for x in p.iter()? {
                            pts.push(x?.extract::<f64>()?);
                        }
                        Baseline::Collecting(pts)
                    }
                };
            }
        }
        if let Some(emas) = st.call_method1("get", ("emas",))?.downcast::<PyDict>().ok() {
            for (k, v) in emas.iter() {
                let k: i64 = k.str()?.to_str()?.trim().parse().map_err(|_| {
                    PyValueError::new_err("an EMA's span is not an int")
                })?;
                let v: Vec<f64> = v.extract()?;
                let e = [
                    v.first().copied().unwrap_or(NAN),
                    v.get(1).copied().unwrap_or(NAN),
                ];
                match self.emas.iter_mut().find(|(s, _)| *s == k) {
                    Some(slot) => slot.1 = e,
                    None => self.emas.push((k, e)),
                }
            }
        }
        Ok(())
    }
}

// -- Window -----------------------------------------------------------------------------------

/// A window split into its current level (the median of its last `k` values) and the
/// reference before it: the window's sorted values without those last ones (at the places
/// `places_of` finds). The reference is not copied out: its median and largest value
/// are read from the sorted window at the places `gone` skips, and it is laid out (into
/// `Window::reference`) only for its robust scale (`shift_z`), read after a cheaper condition
/// of the same tier held, most often.
#[derive(Clone)]
struct Split {
    level: f64,
    med: f64,
    /// whether there is a reference (enough values before the level's)
    has_ref: bool,
    /// the reference's largest value (NaN without one)
    top: f64,
    /// the places in the sorted window of the last values, ascending (none without a reference)
    gone: Vec<usize>,
    k: i64,
    scale: Option<f64>,
}

struct Window {
    track: usize,
    steps_w: i64,
    points: i64,
    st: VecDeque<i64>,
    xs: VecDeque<f64>,
    synced: i64,
    sorted: Option<Vec<f64>>,
    mk: bool,
    s: i64,
    tv: i64,
    tp: i64,
    cache_at: i64,
    cache_noise: Option<(i64, f64)>,
    cache_jump_t: Option<(i64, f64)>,
    cache_split: Option<(i64, Split)>,
    /// the reference of the split, laid out for its robust scale (reused from step to step)
    reference: Vec<f64>,
    cache_flip: Option<(i64, (f64, f64))>,
    cache_ac: Option<f64>,
    sums: bool,
    c: f64,
    t0: i64,
    s1: f64,
    s2: f64,
    st1: i128,
    stt: i128,
    std: f64,
}

impl Window {
    fn new(track: usize, steps: i64, points: i64) -> Window {
        Window {
            track,
            steps_w: steps,
            points,
            st: VecDeque::new(),
            xs: VecDeque::new(),
            synced: 0,
            sorted: None,
            mk: false,
            s: 0,
            tv: 0,
            tp: 0,
            cache_at: -1,
            cache_noise: None,
            cache_jump_t: None,
            cache_split: None,
            reference: Vec::new(),
            cache_flip: None,
            cache_ac: None,
            sums: false,
            c: 0.0,
            t0: 0,
            s1: 0.0,
            s2: 0.0,
            st1: 0,
            stt: 0,
            std: 0.0,
        }
    }

    fn need_sums(&mut self) {
        if !self.sums {
            self.sums = true;
            self.synced = 0;
        }
    }

    fn need_sorted(&mut self) {
        if self.sorted.is_none() {
            self.sorted = Some(Vec::new());
            self.synced = 0;
        }
    }

    fn need_mk(&mut self) {
        self.need_sorted();
        self.mk = true;
    }

    fn sync(&mut self, trk: &Track) {
        let mut pending = trk.total - self.synced;
        if pending == 0 {
            return;
        }
        if pending == 1 && self.synced != 0 {
            let (s, x) = (*trk.steps.back().unwrap(), *trk.values.back().unwrap());
            self.add(s, x);
        } else {
            let have = trk.steps.len() as i64;
            if pending > have || self.synced == 0 {
                self.rebuild(trk);
                pending = have;
            } else {
                let mut i = have - pending;
                while i < have {
                    let (s, x) = (trk.steps[i as usize], trk.values[i as usize]);
                    self.add(s, x);
                    i += 1;
                }
            }
        }
        self.synced = trk.total;
        if self.sums && (pending > 1 || (trk.total & 127) == 0) {
            self.resum();
        }
    }

    /// The window afresh from every point its track holds (a window read for the first time,
    /// as after a restart, or one that fell behind its track): what adding the points one by
    /// one from an empty window gives, with less work. The points those adds would push out
    /// again are found from the steps alone and never added; the sorted values are sorted at
    /// once (a stable sort keeps equal values in the order they came, as the adds'
    /// `bisect_right` does), except where the Mann-Kendall counts need each point's place
    /// among the earlier ones. The sums are worked out afresh (`resum`, as the caller did after
    /// adding more than one point).
    fn rebuild(&mut self, trk: &Track) {
        let have = trk.steps.len();
        // where the adds would leave the window's first point: before adding point i, the
        // window holds points a..i and drops its first while it is at or before the edge and
        // at least `points` are held
        let mut a = 0usize;
        for i in 0..have {
            let edge = trk.steps[i] - self.steps_w;
            while a < i && trk.steps[a] <= edge && (i - a) as i64 >= self.points {
                a += 1;
            }
        }
        self.st.clear();
        self.xs.clear();
        self.s = 0;
        self.tv = 0;
        self.tp = 0;
        if self.mk {
            self.sorted = Some(Vec::with_capacity(have - a));
            for i in a..have {
                self.add(trk.steps[i], trk.values[i]);
            }
        } else {
            self.st.extend(trk.steps.range(a..));
            self.xs.extend(trk.values.range(a..));
            if self.sorted.is_some() {
                let mut v: Vec<f64> = self.xs.iter().copied().collect();
                // no NaN here: a track keeps finite values only
                v.sort_by(|x, y| x.partial_cmp(y).unwrap_or(std::cmp::Ordering::Equal));
                self.sorted = Some(v);
            }
        }
        if self.sums {
            self.resum();   // (the adds' running sums give these same numbers from one point)
        }
    }

    fn resum(&mut self) {
        if self.xs.is_empty() {
            self.s1 = 0.0;
            self.s2 = 0.0;
            self.std = 0.0;
            self.st1 = 0;
            self.stt = 0;
            return;
        }
        self.c = self.xs[0];
        self.t0 = self.st[0];
        let c = self.c;
        let t0 = self.t0;
        let (mut s1, mut s2, mut sd) = (0.0, 0.0, 0.0);
        let (mut st1, mut stt) = (0i128, 0i128);
        for (x, s) in self.xs.iter().zip(self.st.iter()) {
            let d = x - c;
            let t = (*s - t0) as i128;
            s1 += d;
            s2 += d * d;
            st1 += t;
            stt += t * t;
            sd += t as f64 * d;
        }
        self.s1 = s1;
        self.s2 = s2;
        self.st1 = st1;
        self.stt = stt;
        self.std = sd;
    }

    fn add(&mut self, step: i64, x: f64) {
        let edge = step - self.steps_w;
        let sums = self.sums;
        // without the Mann-Kendall counts, the sorted values' slot of the last point pushed out
        // (still held): the new point takes it below, one shift instead of two
        let mut freed: Option<usize> = None;
        while let Some(&f) = self.st.front() {
            if !(f <= edge && self.st.len() as i64 >= self.points) {
                break;
            }
            let ot = self.st.pop_front().unwrap();
            let old = self.xs.pop_front().unwrap();
            if sums {
                let d = old - self.c;
                let t = (ot - self.t0) as i128;
                self.s1 -= d;
                self.s2 -= d * d;
                self.st1 -= t;
                self.stt -= t * t;
                self.std -= t as f64 * d;
            }
            if let Some(srt) = self.sorted.as_mut() {
                if let Some(at) = freed.take() {
                    srt.remove(at);
                }
                let lo = bisect_left(srt, old, 0);
                if !self.mk {
                    freed = Some(lo);
                    continue;
                }
                srt.remove(lo);
                let hi = bisect_right(srt, old, lo);
                self.s -= (srt.len() - hi) as i64 - lo as i64;
                let c = (hi - lo) as i64;
                self.tv -= 6 * c * (c + 2);
                self.tp -= c;
            }
        }
        if let Some(srt) = self.sorted.as_mut() {
            if let Some(lo) = freed {
                replace_sorted(srt, lo, x);
            } else if self.mk {
                let lo = bisect_left(srt, x, 0);
                let hi = bisect_right(srt, x, lo);
                let c = (hi - lo) as i64;
                self.s += lo as i64 - (srt.len() - hi) as i64;
                self.tv += 6 * c * (c + 2);
                self.tp += c;
                srt.insert(hi, x);
            } else {
                let at = bisect_right(srt, x, 0);
                srt.insert(at, x);
            }
        }
        if sums {
            if self.st.is_empty() {
                self.c = x;
                self.t0 = step;
                self.s1 = 0.0;
                self.s2 = 0.0;
                self.std = 0.0;
                self.st1 = 0;
                self.stt = 0;
            }
            let d = x - self.c;
            let t = (step - self.t0) as i128;
            self.s1 += d;
            self.s2 += d * d;
            self.st1 += t;
            self.stt += t * t;
            self.std += t as f64 * d;
        }
        self.st.push_back(step);
        self.xs.push_back(x);
    }

    fn srt(&self) -> &[f64] {
        self.sorted.as_deref().unwrap_or(&[])
    }

    fn median(&self) -> f64 {
        median_of(self.srt())
    }

    fn median_before(&self) -> PyResult<f64> {
        let srt = self.srt();
        if srt.len() < 2 {
            return Ok(NAN);
        }
        let n = srt.len() - 1;
        let p = bisect_left(srt, dq_last(&self.xs)?, 0);
        let at = |k: usize| if k < p { srt[k] } else { srt[k + 1] };
        let h = n / 2;
        Ok(if n % 2 == 1 { at(h) } else { 0.5 * (at(h - 1) + at(h)) })
    }

    fn mean_std(&self, skip_last: bool) -> PyResult<(f64, f64)> {
        let mut n = self.xs.len() as i64;
        let (mut s1, mut s2) = (self.s1, self.s2);
        if skip_last {
            let d = dq_last(&self.xs)? - self.c;
            n -= 1;
            s1 -= d;
            s2 -= d * d;
        }
        if n < 2 {
            return Ok((if n == 1 { self.c + s1 } else { NAN }, NAN));
        }
        let nf = n as f64;
        let var = (s2 - s1 * s1 / nf) / (n - 1) as f64;
        Ok((self.c + s1 / nf, if var > 0.0 { var.sqrt() } else { 0.0 }))
    }

    fn trend_z(&self) -> f64 {
        let n = self.xs.len() as i64;
        if n < 3 {
            return NAN;
        }
        let v = n * (n - 1) * (2 * n + 5) - self.tv;
        if v <= 0 {
            return 0.0;
        }
        let mut s = self.s;
        if s != 0 {
            s = if s > 0 { s - 1 } else { s + 1 };
        }
        s as f64 / (v as f64 / 18.0).sqrt()
    }

    fn trend_tau(&self) -> f64 {
        let n = self.xs.len() as i64;
        let n0 = n * (n - 1) / 2;
        let d = n0 - self.tp;
        if n < 3 || d <= 0 {
            return if n >= 3 { 0.0 } else { NAN };
        }
        self.s as f64 / ((n0 as i128 * d as i128) as f64).sqrt()
    }

    fn slope(&self, py: Python<'_>) -> PyResult<f64> {
        let n = self.xs.len() as i64;
        if n < 2 {
            return Ok(NAN);
        }
        let var = self.stt as f64 - int_truediv(py, self.st1 * self.st1, n as i128)?;
        if var <= 0.0 {
            return Ok(NAN);
        }
        Ok((self.std - self.st1 as f64 * self.s1 / n as f64) / var)
    }

    fn xs_vec(&self) -> Vec<f64> {
        self.xs.iter().copied().collect()
    }
}

// -- CycleRise --------------------------------------------------------------------------------

struct CycleRise {
    metric: String,
    metric_py: Py<PyString>,
    cycle_metric: Option<String>,
    cycle_metric_py: Option<Py<PyString>>,
    start: f64,
    last_cycle: f64,
    out: f64,
    /// the cycle counter at the cycle's first logged value
    start_cycle: f64,
    /// the last value taken
    last: f64,
    /// the lowest and the highest cycle counter seen
    lo: f64,
    hi: f64,
    /// the rise of the last cycle that ended, over a whole cycle
    done: f64,
}

impl CycleRise {
    /// (streams.signals.CycleRise.update: the same arithmetic, in the same order)
    fn update(&mut self, x: f64, metrics: &Bound<'_, PyDict>) -> PyResult<()> {
        let c = match &self.cycle_metric_py {
            Some(name) => match metrics.get_item(name.bind(metrics.py()))? {
                Some(v) => v.extract::<f64>()?,
                None => NAN,
            },
            None => NAN,
        };
        if self.start.is_nan() || (!c.is_nan() && !self.last_cycle.is_nan() && c <= self.last_cycle) {
            let seen = self.last_cycle - self.start_cycle;
            if seen > 0.0 && self.hi - self.lo >= seen {
                self.done = (self.last - self.start) * ((self.hi - self.lo) / seen);
            }
            self.start = x;
            self.start_cycle = c;
        }
        if !c.is_nan() {
            if !(c >= self.lo) {
                self.lo = c;
            }
            if !(c <= self.hi) {
                self.hi = c;
            }
        }
        self.last_cycle = c;
        self.last = x;
        let rise = x - self.start;
        self.out = if self.done > rise { self.done } else { rise };
        Ok(())
    }

    /// The values a state keeps, in streams.signals.CycleRise.to_state's order.
    fn values(&self) -> [f64; 8] {
        [self.start, self.last_cycle, self.out, self.start_cycle, self.last, self.lo, self.hi, self.done]
    }
}

/// A rise of a ramp counts when it exceeds the high by more than this share of it
/// (streams.signals.RAMP_RISE).
const RAMP_RISE: f64 = 1e-6;

/// Where a metric last rose above its high: the end of its ramp (streams.signals.Ramp).
struct Ramp {
    metric: String,
    metric_py: Py<PyString>,
    peak: f64,
    step: Option<i64>,
}

impl Ramp {
    #[inline]
    fn update(&mut self, step: i64, x: f64) {
        if !(x <= self.peak + RAMP_RISE * self.peak.abs()) {
            if !self.peak.is_nan() {
                self.step = Some(step);
            }
            self.peak = x;
        }
    }
}

// -- the signals ------------------------------------------------------------------------------

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Sig {
    Value,
    Ema,
    CycleRise,
    FollowZ,
    RatioToStart,
    Start,
    StartZ,
    GainT,
    NoiseRatio,
    RatioToStartMax,
    Delta,
    ShiftZ,
    LevelRatio,
    ShiftRel,
    RangePos,
    LevelToMax,
    RatioToMax,
    OverMaxZ,
    ShiftDz,
    JumpDz,
    JumpT,
    ShiftGain,
    DrawdownGain,
    Median,
    Min,
    Max,
    Range,
    Mean,
    Std,
    TrendZ,
    TrendTau,
    Slope,
    RatioToMedian,
    Zscore,
    RobustZ,
    RelDrop,
    RelRise,
    FlatRange,
    RelTrend,
    TrendGain,
    LevelChange,
    SignFlipRate,
    DiffRatio,
    Autocorr,
}

impl Sig {
    fn parse(s: &str) -> Option<Sig> {
        use Sig::*;
        Some(match s {
            "value" => Value,
            "ema" => Ema,
            "cycle_rise" => CycleRise,
            "follow_z" => FollowZ,
            "ratio_to_start" => RatioToStart,
            "start" => Start,
            "start_z" => StartZ,
            "gain_t" => GainT,
            "noise_ratio" => NoiseRatio,
            "ratio_to_start_max" => RatioToStartMax,
            "delta" => Delta,
            "shift_z" => ShiftZ,
            "level_ratio" => LevelRatio,
            "shift_rel" => ShiftRel,
            "range_pos" => RangePos,
            "level_to_max" => LevelToMax,
            "ratio_to_max" => RatioToMax,
            "over_max_z" => OverMaxZ,
            "shift_dz" => ShiftDz,
            "jump_dz" => JumpDz,
            "jump_t" => JumpT,
            "shift_gain" => ShiftGain,
            "drawdown_gain" => DrawdownGain,
            "median" => Median,
            "min" => Min,
            "max" => Max,
            "range" => Range,
            "mean" => Mean,
            "std" => Std,
            "trend_z" => TrendZ,
            "trend_tau" => TrendTau,
            "slope" => Slope,
            "ratio_to_median" => RatioToMedian,
            "zscore" => Zscore,
            "robust_z" => RobustZ,
            "rel_drop" => RelDrop,
            "rel_rise" => RelRise,
            "flat_range" => FlatRange,
            "rel_trend" => RelTrend,
            "trend_gain" => TrendGain,
            "level_change" => LevelChange,
            "sign_flip_rate" => SignFlipRate,
            "diff_ratio" => DiffRatio,
            "autocorr" => Autocorr,
            _ => return None,
        })
    }
}

#[derive(Clone, Copy)]
struct Spec {
    sig: Sig,
    trk: usize,
    /// the window read (the level window of ratio_to_start, start_z, ratio_to_start_max)
    win: usize,
    /// follow_z: the second metric's window
    other: usize,
    cycle: usize,
    /// after_warmup_of: the ramp the warm-up counts from (NONE: the metric's first step)
    ramp: usize,
    window: i64,
    need_points: i64,
    warm: i64,
    /// the steps of the warm-up counted from the end of the ramp, less one
    ramp_warm: i64,
}

struct ReaderDef {
    spec: Spec,
    memo_version: i64,
    memo: f64,
}

struct Core {
    step: i64,
    version: i64,
    tracks: Vec<Track>,
    track_keys: HashMap<(String, Option<i64>), usize>,
    by_metric: Vec<(Py<PyString>, Vec<usize>)>,
    by_metric_keys: HashMap<String, usize>,
    windows: Vec<Window>,
    window_keys: HashMap<(String, Option<i64>, i64, i64), usize>,
    cycles: Vec<CycleRise>,
    cycle_keys: HashMap<(String, Option<String>), usize>,
    ramps: Vec<Ramp>,
    ramp_keys: HashMap<String, usize>,
    readers: Vec<ReaderDef>,
}

const NONE: usize = usize::MAX;

impl Core {
    fn new() -> Core {
        Core {
            step: -1,
            version: 0,
            tracks: Vec::new(),
            track_keys: HashMap::new(),
            by_metric: Vec::new(),
            by_metric_keys: HashMap::new(),
            windows: Vec::new(),
            window_keys: HashMap::new(),
            cycles: Vec::new(),
            cycle_keys: HashMap::new(),
            ramps: Vec::new(),
            ramp_keys: HashMap::new(),
            readers: Vec::new(),
        }
    }

    fn track(&mut self, py: Python<'_>, metric: &str, smooth: Option<i64>) -> PyResult<usize> {
        let key = (metric.to_string(), smooth);
        if let Some(&i) = self.track_keys.get(&key) {
            return Ok(i);
        }
        let i = self.tracks.len();
        self.tracks.push(Track::new(metric.to_string(), smooth)?);
        self.track_keys.insert(key, i);
        match self.by_metric_keys.get(metric) {
            Some(&j) => self.by_metric[j].1.push(i),
            None => {
                self.by_metric_keys.insert(metric.to_string(), self.by_metric.len());
                self.by_metric
                    .push((PyString::intern_bound(py, metric).unbind(), vec![i]));
            }
        }
        Ok(i)
    }

    /// The ramp of ``metric`` (after_warmup_of), shared by every reader that names it.
    fn ramp(&mut self, py: Python<'_>, metric: String) -> usize {
        if let Some(&r) = self.ramp_keys.get(&metric) {
            return r;
        }
        let r = self.ramps.len();
        self.ramps.push(Ramp {
            metric_py: PyString::intern_bound(py, &metric).unbind(),
            metric: metric.clone(),
            peak: NAN,
            step: None,
        });
        self.ramp_keys.insert(metric, r);
        r
    }

    /// The window of ``steps`` steps and at least ``points`` points on ``trk``, shared by the
    /// readers that ask for both alike, not by one that asks for fewer points (the Python
    /// bank's ``window``: a rule's numbers must not depend on the other rules of the pack).
    fn window(&mut self, trk: usize, steps: i64, points: i64) -> usize {
        let t = &self.tracks[trk];
        let key = (t.metric.clone(), t.smooth, steps, points);
        let w = match self.window_keys.get(&key) {
            Some(&w) => w,
            None => {
                let w = self.windows.len();
                self.windows.push(Window::new(trk, steps, points));
                self.window_keys.insert(key, w);
                w
            }
        };
        self.tracks[trk].need(steps, points);
        w
    }

    #[inline]
    fn sync(&mut self, w: usize) {
        let win = &mut self.windows[w];
        win.sync(&self.tracks[win.track]);
    }

    fn read(&mut self, py: Python<'_>, idx: usize) -> PyResult<f64> {
        let r = &self.readers[idx];
        let spec = r.spec;
        let trk = &self.tracks[spec.trk];
        if trk.last_step != Some(self.step) {
            return Ok(NAN);
        }
        let x = trk.cur;
        if x - x != 0.0 {
            return Ok(x);
        }
        if trk.n < spec.need_points {
            return Ok(NAN);
        }
        let first = trk.first_step.ok_or_else(|| {
            PyTypeError::new_err("unsupported operand type(s) for -: 'int' and 'NoneType'")
        })?;
        if self.step - first < spec.warm {
            return Ok(NAN);
        }
        if spec.ramp != NONE {
            // the warm-up counts from the end of the ramp
            if let Some(at) = self.ramps[spec.ramp].step {
                if self.step - at < spec.ramp_warm {
                    return Ok(NAN);
                }
            }
        }
        if r.memo_version == self.version {
            return Ok(r.memo);
        }
        let v = self.value(py, &spec)?;
        let r = &mut self.readers[idx];
        r.memo = v;
        r.memo_version = self.version;
        Ok(v)
    }

    fn split(&mut self, py: Python<'_>, w: usize) -> PyResult<()> {
        self.sync(w);
        let win = &mut self.windows[w];
        let total = self.tracks[win.track].total;
        if let Some((t, _)) = &win.cache_split {
            if *t == total {
                return Ok(());
            }
        }
        let n = win.xs.len() as i64;
        let edge = dq_last(&win.st)? - LEVEL_STEPS;
        let mut k = 0i64;
        while k < n && win.st[(n - 1 - k) as usize] > edge {
            k += 1;
        }
        let k = k.max(LEVEL_POINTS);
        // (the places of the split before, filled again: no allocation per step)
        let mut gone = match win.cache_split.take() {
            Some((_, sp)) => sp.gone,
            None => Vec::new(),
        };
        gone.clear();
        let out = if n - k < SPLIT_REF_POINTS {
            Split { level: NAN, med: NAN, has_ref: false, top: NAN, gone, k, scale: Some(NAN) }
        } else {
            let lastv: Vec<f64> = (0..k).map(|i| win.xs[(n - 1 - i) as usize]).collect();
            let last_sorted = sorted(py, lastv)?;
            // (the last values are among the window's: the window holds what its track does)
            let srt = win.srt();
            if !places_of(srt, &last_sorted, &mut gone) {
                return Err(index_error());
            }
            let len = srt.len() - gone.len();
            let at = |m: usize| srt[skipping(&gone, m)];
            // median_of of the reference
            let med = if len % 2 == 1 { at(len / 2) } else { 0.5 * (at(len / 2 - 1) + at(len / 2)) };
            let top = at(len - 1);
            Split { level: median_of(&last_sorted), med, has_ref: true, top, gone, k, scale: None }
        };
        win.cache_split = Some((total, out));
        Ok(())
    }

    fn split_ref_scale(&mut self, py: Python<'_>, w: usize) -> PyResult<f64> {
        let win = &mut self.windows[w];
        let (_, sp) = win.cache_split.as_ref().unwrap();
        if let Some(s) = sp.scale {
            return Ok(s);
        }
        let mut reference = std::mem::take(&mut win.reference);
        without_places(win.srt(), &sp.gone, &mut reference);
        let s = robust_scale_sorted(py, &reference, sp.med);
        win.reference = reference;
        let s = s?;
        win.cache_split.as_mut().unwrap().1.scale = Some(s);
        Ok(s)
    }

    fn value(&mut self, py: Python<'_>, r: &Spec) -> PyResult<f64> {
        use Sig::*;
        let window = r.window;
        match r.sig {
            Value => {
                let trk = &self.tracks[r.trk];
                if trk.smoothed_flag() {
                    dq_last(&trk.values)
                } else {
                    Ok(trk.cur)
                }
            }
            Ema => Ok(self.tracks[r.trk].ema(window)),
            CycleRise => Ok(self.cycles[r.cycle].out),
            FollowZ => {
                self.sync(r.win);
                let z = self.windows[r.win].trend_z();
                self.sync(r.other);
                let other = &self.windows[r.other];
                if self.tracks[other.track].last_step != self.tracks[r.trk].last_step {
                    return Ok(NAN);
                }
                Ok(if !z.is_nan() && z != 0.0 { ratio(other.trend_z(), z) } else { NAN })
            }
            // where the run started: the median of its first `window` steps
            Start => Ok(self.tracks[r.trk].baseline(window)),
            RatioToStart => {
                self.sync(r.win);
                let trk = &self.tracks[r.trk];
                Ok(ratio(self.windows[r.win].median(), trk.baseline(window)))
            }
            StartZ => {
                self.sync(r.win);
                let trk = &self.tracks[r.trk];
                Ok(zscore(
                    self.windows[r.win].median(),
                    trk.baseline(window),
                    trk.baseline_stat(window, 1),
                ))
            }
            RatioToStartMax => {
                self.sync(r.win);
                let trk = &self.tracks[r.trk];
                Ok(ratio(self.windows[r.win].median(), trk.baseline_stat(window, 3)))
            }
            GainT => {
                self.sync(r.win);
                let w = &self.windows[r.win];
                let trk = &self.tracks[r.trk];
                let n_r = w.xs.len();
                let n_b = trk.baseline_stat(window, 2);
                if n_r < 2 || !(n_b >= 2.0) {
                    return Ok(NAN);
                }
                let med_r = w.median();
                let s_r = robust_scale(py, &w.xs_vec(), med_r)?;
                let s_b = trk.baseline_stat(window, 1);
                let se = MEAN_AD_SCALE
                    * (fdiv(s_r * s_r, n_r as f64)? + fdiv(s_b * s_b, n_b)?).sqrt();
                Ok(zscore(med_r, trk.baseline(window), se))
            }
            NoiseRatio => {
                self.sync(r.win);
                let w = &self.windows[r.win];
                let trk = &self.tracks[r.trk];
                if let Some((t, v)) = w.cache_noise {
                    if t == trk.total {
                        return Ok(v);
                    }
                }
                let out = ratio(diff_scale(py, &w.xs_vec())?, trk.baseline_stat(window, 4));
                let total = trk.total;
                self.windows[r.win].cache_noise = Some((total, out));
                Ok(out)
            }
            Delta => {
                let v = &self.tracks[r.trk].values;
                let n = v.len();
                Ok(if n >= 2 { v[n - 1] - v[n - 2] } else { NAN })
            }
            ShiftZ => {
                self.split(py, r.win)?;
                let (level, med, has_ref) = {
                    let sp = &self.windows[r.win].cache_split.as_ref().unwrap().1;
                    (sp.level, sp.med, sp.has_ref)
                };
                if !has_ref {
                    return Ok(NAN);
                }
                let scale = self.split_ref_scale(py, r.win)?;
                Ok(zscore(level, med, scale))
            }
            LevelRatio => {
                self.split(py, r.win)?;
                let sp = &self.windows[r.win].cache_split.as_ref().unwrap().1;
                Ok(ratio(sp.level, sp.med))
            }
            ShiftRel => {
                self.split(py, r.win)?;
                let sp = &self.windows[r.win].cache_split.as_ref().unwrap().1;
                Ok(ratio(sp.level - sp.med, sp.med.abs()))
            }
            LevelToMax => {
                self.split(py, r.win)?;
                let sp = &self.windows[r.win].cache_split.as_ref().unwrap().1;
                if !sp.has_ref {
                    return Ok(NAN);
                }
                Ok(ratio(sp.level, sp.top))
            }
            // the level against a center in the reference's point-to-point noise: over_max_z
            // (the reference's maximum: a trend climbs past it a step of noise at a time, a
            // jump does not), shift_dz (its median: a learning curve swells the robust scale
            // of a window stretched to its points, not that of the changes), jump_dz (the level
            // just before, the median of as many points before the level's: a crash is a jump
            // between two adjacent levels, which the reference's median lags by half the climb
            // of a learning curve in the window)
            OverMaxZ | ShiftDz | JumpDz => {
                self.split(py, r.win)?;
                let w = &self.windows[r.win];
                let sp = &w.cache_split.as_ref().unwrap().1;
                if !sp.has_ref {
                    return Ok(NAN);
                }
                let n = w.xs.len() as i64;
                let end = (n - sp.k).max(0) as usize;
                let center = match r.sig {
                    OverMaxZ => sp.top,
                    ShiftDz => sp.med,
                    _ => {
                        let start = (n - 2 * sp.k).max(0) as usize;
                        let before: Vec<f64> =
                            w.xs.iter().skip(start).take(end - start).copied().collect();
                        median_of(&sorted(py, before)?)
                    }
                };
                let head: Vec<f64> = w.xs.iter().take(end).copied().collect();
                Ok(zscore(sp.level, center, diff_scale(py, &head)?))
            }
            // the mean of the window's last quarter (at least JUMP_BLOCK_POINTS points, without
            // its lowest and highest) against that of as many points just before them, in the
            // standard error of that difference from the standard deviation of the points
            // before the quarter (streams.signals: the same numbers in the same order)
            JumpT => {
                self.sync(r.win);
                let w = &self.windows[r.win];
                let trk = &self.tracks[r.trk];
                if let Some((t, v)) = w.cache_jump_t {
                    if t == trk.total {
                        return Ok(v);
                    }
                }
                let n = w.xs.len() as i64;
                let k = n / 4;
                let out = if k < JUMP_BLOCK_POINTS {
                    NAN
                } else {
                    let end = (n - k) as usize;
                    let head: Vec<f64> = w.xs.iter().take(end).copied().collect();
                    let last: Vec<f64> = w.xs.iter().skip(end).copied().collect();
                    let d = trimmed_sum(py, last)? - trimmed_sum(py, head[end - k as usize..].to_vec())?;
                    let se = sample_std(&head) * (2.0 / (k - 2) as f64).sqrt();
                    zscore(d / (k - 2) as f64, 0.0, se)
                };
                let total = trk.total;
                self.windows[r.win].cache_jump_t = Some((total, out));
                Ok(out)
            }
            // the change in the run's own unit: what it moved since its start (its first
            // START_STEPS steps) plus that start's robust scale (a reward model's zero is
            // arbitrary; what the run gained and lost is not)
            ShiftGain => {
                self.split(py, r.win)?;
                let sp = &self.windows[r.win].cache_split.as_ref().unwrap().1;
                if !sp.has_ref {
                    return Ok(NAN);
                }
                let trk = &self.tracks[r.trk];
                let unit = trk.gain_unit(sp.med);
                let d = sp.level - sp.med;
                Ok(if unit == 0.0 && d == 0.0 { 0.0 } else { ratio(d, unit) })
            }
            // how much of its best gain the run has given back: the level against the best
            // level of the window's earlier points (the largest median of 3 points in a row), in
            // what the run had gained at that best since its start plus that start's robust
            // scale (streams.signals: the same comparisons in the same order)
            DrawdownGain => {
                self.split(py, r.win)?;
                let w = &self.windows[r.win];
                let sp = &w.cache_split.as_ref().unwrap().1;
                if !sp.has_ref {
                    return Ok(NAN);
                }
                let end = (w.xs.len() as i64 - sp.k).max(0) as usize;
                let mut best = NAN;
                let (mut a, mut b) = (NAN, NAN);
                for (i, &c) in w.xs.iter().take(end).enumerate() {
                    if i >= 2 {
                        let m = py_max(py_min(a, b), py_min(py_max(a, b), c));
                        if !(m <= best) {
                            best = m;
                        }
                    }
                    a = b;
                    b = c;
                }
                let trk = &self.tracks[r.trk];
                let unit = trk.gain_unit(best);
                let d = sp.level - best;
                Ok(if unit == 0.0 && d == 0.0 { 0.0 } else { ratio(d, unit) })
            }
            RangePos => {
                self.split(py, r.win)?;
                let w = &self.windows[r.win];
                let sp = &w.cache_split.as_ref().unwrap().1;
                let srt = w.srt();
                let (lo, hi) = (first(srt)?, last(srt)?);
                Ok(if hi > lo { fdiv(sp.level - lo, hi - lo)? } else { NAN })
            }
            RatioToMax => {
                self.sync(r.win);
                let w = &self.windows[r.win];
                let n = w.xs.len();
                if n < 2 {
                    return Ok(NAN);
                }
                let x = w.xs[n - 1];
                let srt = w.srt();
                let m = srt.len();
                if m < 2 {
                    return Err(index_error());
                }
                let lo = if srt[0] == x { srt[1] } else { srt[0] };
                let hi = if srt[m - 1] == x { srt[m - 2] } else { srt[m - 1] };
                Ok(ratio(x.abs(), py_max(lo.abs(), hi.abs())))
            }
            Median => {
                self.sync(r.win);
                Ok(self.windows[r.win].median())
            }
            Min => {
                self.sync(r.win);
                first(self.windows[r.win].srt())
            }
            Max => {
                self.sync(r.win);
                last(self.windows[r.win].srt())
            }
            Range => {
                self.sync(r.win);
                let srt = self.windows[r.win].srt();
                Ok(last(srt)? - first(srt)?)
            }
            Mean => {
                self.sync(r.win);
                Ok(self.windows[r.win].mean_std(false)?.0)
            }
            Std => {
                self.sync(r.win);
                Ok(self.windows[r.win].mean_std(false)?.1)
            }
            TrendZ => {
                self.sync(r.win);
                Ok(self.windows[r.win].trend_z())
            }
            TrendTau => {
                self.sync(r.win);
                Ok(self.windows[r.win].trend_tau())
            }
            Slope => {
                self.sync(r.win);
                self.windows[r.win].slope(py)
            }
            RatioToMedian => {
                self.sync(r.win);
                let w = &self.windows[r.win];
                let before = w.median_before()?;
                Ok(ratio(dq_last(&w.xs)?, before))
            }
            Zscore => {
                self.sync(r.win);
                let w = &self.windows[r.win];
                let (m, s) = w.mean_std(true)?;
                let x = dq_last(&w.xs)?;
                if s.is_nan() {
                    return Ok(NAN);
                }
                Ok(if s > 0.0 {
                    (x - m) / s
                } else if x == m {
                    0.0
                } else {
                    INF.copysign(x - m)
                })
            }
            RobustZ => {
                self.sync(r.win);
                let w = &self.windows[r.win];
                let med = w.median_before()?;
                let n = w.xs.len();
                let dev: Vec<f64> =
                    w.xs.iter().take(n.saturating_sub(1)).map(|v| (v - med).abs()).collect();
                let mad = median_selected(py, dev)? * 1.4826;
                let x = dq_last(&w.xs)?;
                Ok(if mad > 0.0 {
                    (x - med) / mad
                } else if x == med {
                    0.0
                } else {
                    INF.copysign(x - med)
                })
            }
            RelDrop => {
                self.sync(r.win);
                let w = &self.windows[r.win];
                let peak = last(w.srt())?;
                let x = dq_last(&w.xs)?;
                Ok(if peak != 0.0 { (peak - x) / peak.abs() } else { NAN })
            }
            RelRise => {
                self.sync(r.win);
                let w = &self.windows[r.win];
                let low = first(w.srt())?;
                let x = dq_last(&w.xs)?;
                Ok(if low != 0.0 { (x - low) / low.abs() } else { NAN })
            }
            FlatRange => {
                self.sync(r.win);
                let w = &self.windows[r.win];
                let srt = w.srt();
                let (lo, hi) = (first(srt)?, last(srt)?);
                let m = w.mean_std(false)?.0;
                Ok(if m != 0.0 { (hi - lo) / m.abs() } else { NAN })
            }
            // the climb across the window as a share of the level (rel_trend), or in the run's
            // own unit (trend_gain, shift_gain's): what the run moved since its start, plus that
            // start's robust scale
            RelTrend | TrendGain => {
                self.sync(r.win);
                let w = &self.windows[r.win];
                let span = dq_last(&w.st)? - w.st[0] + 1;
                if span < window.div_euclid(2) {
                    return Ok(NAN);
                }
                let climb = w.slope(py)? * window as f64;
                if matches!(r.sig, RelTrend) {
                    return Ok(climb / py_max(w.median().abs(), 1e-12));
                }
                let trk = &self.tracks[r.trk];
                let unit = trk.gain_unit(w.median());
                Ok(ratio(climb, unit))
            }
            LevelChange => {
                self.sync(r.win);
                let w = &self.windows[r.win];
                if dq_last(&w.st)? - w.st[0] + 1 < window.div_euclid(2) {
                    return Ok(NAN);
                }
                let v = w.xs_vec();
                let n = v.len();
                let k = 5usize.max(n / 10);
                let tail = v[n.saturating_sub(k)..].to_vec();
                let head = v[..k.min(n)].to_vec();
                Ok(ratio(median_of(&sorted(py, tail)?), median_of(&sorted(py, head)?)) - 1.0)
            }
            SignFlipRate | DiffRatio => {
                self.sync(r.win);
                let total = self.tracks[r.trk].total;
                let w = &self.windows[r.win];
                let out = match w.cache_flip {
                    Some((t, v)) if t == total => v,
                    _ => {
                        let v = w.xs_vec();
                        let out = flip_and_diff(&v)?;
                        self.windows[r.win].cache_flip = Some((total, out));
                        out
                    }
                };
                Ok(if r.sig == SignFlipRate { out.0 } else { out.1 })
            }
            Autocorr => {
                // worked out again once the run is window/20 steps on (not points)
                let step = self.tracks[r.trk].last_step.unwrap_or(0);
                let every = 1i64.max(window.div_euclid(20));
                {
                    let w = &self.windows[r.win];
                    let since = step - w.cache_at;
                    if w.cache_at >= 0 && 0 <= since && since < every {
                        return Ok(w.cache_ac.unwrap_or(NAN));
                    }
                }
                self.windows[r.win].cache_at = step;
                self.sync(r.win);
                let out = autocorr(self.windows[r.win].xs.make_contiguous());
                self.windows[r.win].cache_ac = Some(out);
                Ok(out)
            }
        }
    }
}

/// Strength of the dominant autocorrelation lag (`streams.signals._autocorr`, the reference,
/// which does every float operation in this order): on the detrended values (mean, then the
/// least-squares line removed), the largest autocorrelation at a lag of 2 to n/2 points that is
/// a local peak of the autocorrelation function after its first fall to zero or below (a
/// period, not the noise on a slow decay); 0 when there is none; NaN under 8 values or
/// with nothing left after detrending.
fn autocorr(v: &[f64]) -> f64 {
    let n = v.len();
    if n < 8 {
        return NAN;
    }
    let mut s = 0.0;
    for &x in v {
        s += x;
    }
    let mean = s / n as f64;
    let mut y: Vec<f64> = v.iter().map(|&x| x - mean).collect();
    let mut total = 0.0;
    for &a in &y {
        total += a * a;
    }
    let c = (n - 1) as f64 / 2.0;
    let (mut ty, mut tt) = (0.0, 0.0);
    for (i, &a) in y.iter().enumerate() {
        let t = i as f64 - c;
        ty += t * a;
        tt += t * t;
    }
    let b = ty / tt;
    for (i, a) in y.iter_mut().enumerate() {
        *a -= (i as f64 - c) * b;
    }
    let mut denom = 0.0;
    for &a in &y {
        denom += a * a;
    }
    if !(denom > 1e-24 * total) || total == 0.0 {
        return NAN;
    }
    let m = (n / 2 + 1).min(n - 1);
    let r: Vec<f64> = (0..=m)
        .map(|k| {
            let mut acc = 0.0;
            for i in 0..n - k {
                acc += y[i + k] * y[i];
            }
            acc / denom
        })
        .collect();
    let mut best: Option<f64> = None;
    let mut crossed = r[1] <= 0.0;
    for k in 2..m {
        if crossed && r[k] >= r[k - 1] && r[k] >= r[k + 1] {
            best = Some(match best {
                Some(b) if !(r[k] > b) => b,
                _ => r[k],
            });
        }
        crossed = crossed || r[k] <= 0.0;
    }
    best.unwrap_or(0.0)
}

/// (sign flip rate, diff ratio) of a window's values.
fn flip_and_diff(v: &[f64]) -> PyResult<(f64, f64)> {
    let n = v.len();
    let d: Vec<f64> = v.windows(2).map(|w| w[1] - w[0]).collect();
    if d.len() < 2 {
        return Ok((NAN, NAN));
    }
    let mut pairs = 0usize;
    let mut neg = 0usize;
    for w in d.windows(2) {
        let p = w[0] * w[1];
        if p != 0.0 || p.is_nan() {
            pairs += 1;
            if p < 0.0 {
                neg += 1;
            }
        }
    }
    let flips = if pairs > 0 { neg as f64 / pairs as f64 } else { NAN };
    let c = v[0];
    let x: Vec<f64> = v.iter().map(|a| a - c).collect();
    // (squares multiplied, as the reference does: a value over 1e154 makes them infinite)
    let nf = n as f64;
    let s1 = psum(x.iter().copied()) / nf;
    let sx = py_max(0.0, psum(x.iter().map(|a| a * a)) / nf - s1 * s1).sqrt();
    let m = d.len() as f64;
    let sd1 = psum(d.iter().copied()) / m;
    let sd = py_max(0.0, psum(d.iter().map(|a| a * a)) / m - sd1 * sd1).sqrt();
    let mut scale = v[0].abs();
    for a in &v[1..] {
        let a = a.abs();
        if a > scale {
            scale = a;
        }
    }
    let ratio = if scale > 0.0 { fdiv(sd, sx + 1e-12 * scale)? } else { 0.0 };
    Ok((flips, ratio))
}

// -- the Python classes -----------------------------------------------------------------------

fn lock(core: &Arc<Mutex<Core>>) -> PyResult<MutexGuard<'_, Core>> {
    lock_of(core, "Bank")
}

/// The state behind a native object, which is never shared between threads: a second thread
/// at once is an error, not a wait.
pub(crate) fn lock_of<'a, T>(m: &'a Arc<Mutex<T>>, what: &str) -> PyResult<MutexGuard<'a, T>> {
    match m.try_lock() {
        Ok(g) => Ok(g),
        Err(std::sync::TryLockError::Poisoned(p)) => Ok(p.into_inner()),
        Err(std::sync::TryLockError::WouldBlock) => Err(PyRuntimeError::new_err(format!(
            "streams._native.{what} used from two threads at once"
        ))),
    }
}

/// A reader of one signal (see Bank.metric): called with no argument, gives the value now.
#[pyclass(module = "streams._native")]
struct Reader {
    core: Arc<Mutex<Core>>,
    idx: usize,
}

#[pymethods]
impl Reader {
    fn __call__(&self, py: Python<'_>) -> PyResult<f64> {
        lock(&self.core)?.read(py, self.idx)
    }
    /// The native test of this reader against a threshold (rules/compile.py uses it when it
    /// is there): kind is "above", "below" or "abs_above".
    fn compare(&self, kind: &str, threshold: f64) -> PyResult<logic::Compare> {
        logic::compare(self, kind, threshold)
    }
}

/// A copy of one track's values (Bank.tracks), for inspection.
#[pyclass(module = "streams._native")]
struct TrackView {
    #[pyo3(get)]
    metric: String,
    #[pyo3(get)]
    smooth: Option<i64>,
    #[pyo3(get)]
    steps: Vec<i64>,
    #[pyo3(get)]
    values: Vec<f64>,
    #[pyo3(get)]
    total: i64,
    #[pyo3(get)]
    n: i64,
    #[pyo3(get)]
    first_step: Option<i64>,
    #[pyo3(get)]
    last_step: Option<i64>,
    #[pyo3(get)]
    cur: f64,
    smoothed_value: f64,
    emas: Vec<(i64, f64)>,
    bases: Vec<(i64, Vec<f64>)>,
}

#[pymethods]
impl TrackView {
    fn smoothed(&self) -> f64 {
        self.smoothed_value
    }

    fn ema(&self, span: i64) -> f64 {
        self.emas.iter().find(|(s, _)| *s == span).map(|(_, v)| *v).unwrap_or(NAN)
    }

    fn baseline(&self, window: i64) -> f64 {
        self.baseline_stat(window, 0)
    }

    fn baseline_stat(&self, window: i64, i: usize) -> f64 {
        self.bases
            .iter()
            .find(|(w, _)| *w == window)
            .and_then(|(_, v)| v.get(i).copied())
            .unwrap_or(NAN)
    }
}

/// The tracks and windows of one rank of one run (streams.signals.Bank, in Rust).
#[pyclass(module = "streams._native")]
struct Bank {
    core: Arc<Mutex<Core>>,
    readers: Py<PyDict>,
}

#[pymethods]
impl Bank {
    #[new]
    fn new(py: Python<'_>) -> Bank {
        Bank { core: Arc::new(Mutex::new(Core::new())), readers: PyDict::new_bound(py).unbind() }
    }

    /// Its readers, for the cycle collector (they hold no Python objects; visited so that a
    /// reader put in a cycle later is seen).
    fn __traverse__(&self, visit: pyo3::PyVisit<'_>) -> Result<(), pyo3::PyTraverseError> {
        visit.call(&self.readers)
    }

    #[getter]
    fn get_step(&self) -> PyResult<i64> {
        Ok(lock(&self.core)?.step)
    }

    #[setter]
    fn set_step(&self, step: i64) -> PyResult<()> {
        lock(&self.core)?.step = step;
        Ok(())
    }

    #[getter]
    fn get_version(&self) -> PyResult<i64> {
        Ok(lock(&self.core)?.version)
    }

    #[setter]
    fn set_version(&self, version: i64) -> PyResult<()> {
        lock(&self.core)?.version = version;
        Ok(())
    }

    /// Whether any track is read (the Python class has a dict here: only its truth is used).
    #[getter]
    fn by_metric(&self) -> PyResult<bool> {
        Ok(!lock(&self.core)?.by_metric.is_empty())
    }

    /// {(metric, smooth): a copy of the track}
    #[getter]
    fn tracks(&self, py: Python<'_>) -> PyResult<PyObject> {
        let core = lock(&self.core)?;
        let out = PyDict::new_bound(py);
        for t in &core.tracks {
            let view = TrackView {
                metric: t.metric.clone(),
                smooth: t.smooth,
                steps: t.steps.iter().copied().collect(),
                values: t.values.iter().copied().collect(),
                total: t.total,
                n: t.n,
                first_step: t.first_step,
                last_step: t.last_step,
                cur: t.cur,
                smoothed_value: t.smoothed(),
                emas: t.emas.iter().map(|(s, _)| (*s, t.ema(*s))).collect(),
                bases: t
                    .baselines
                    .iter()
                    .filter_map(|(w, b)| match b {
                        Baseline::Frozen { v, .. } => Some((*w, v.clone())),
                        _ => None,
                    })
                    .collect(),
            };
            out.set_item((t.metric.clone(), t.smooth), Py::new(py, view)?)?;
        }
        Ok(out.into_py(py))
    }

    /// A reader of ``signal`` of ``metric`` (see rules.compile.Source); shared by every
    /// condition that reads the same thing.
    #[pyo3(signature = (metric, signal, window, smooth, cycle_metric, min_steps, min_points, ready_points=None, after_warmup_of=None, after_warmup_steps=None))]
    #[allow(clippy::too_many_arguments)]
    fn metric(
        &self,
        py: Python<'_>,
        metric: &Bound<'_, PyAny>,
        signal: &Bound<'_, PyAny>,
        window: &Bound<'_, PyAny>,
        smooth: &Bound<'_, PyAny>,
        cycle_metric: &Bound<'_, PyAny>,
        min_steps: &Bound<'_, PyAny>,
        min_points: &Bound<'_, PyAny>,
        ready_points: Option<&Bound<'_, PyAny>>,
        after_warmup_of: Option<&Bound<'_, PyAny>>,
        after_warmup_steps: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<PyObject> {
        let one = 1i64.into_py(py).into_bound(py);
        let ready_points = ready_points.unwrap_or(&one);
        let nothing = py.None().into_bound(py);
        let after_warmup_of = after_warmup_of.unwrap_or(&nothing);
        let after_warmup_steps = after_warmup_steps.unwrap_or(&nothing);
        let key = PyTuple::new_bound(
            py,
            [
                metric,
                signal,
                window,
                smooth,
                cycle_metric,
                min_steps,
                min_points,
                ready_points,
                after_warmup_of,
                after_warmup_steps,
            ],
        );
        let readers = self.readers.bind(py);
        if let Some(r) = readers.get_item(&key)? {
            return Ok(r.unbind());
        }
        let metric_s: String = metric.extract()?;
        let signal_s: String = signal.extract()?;
        let window_i: Option<i64> = opt_i64(window)?;
        let smooth_i: Option<i64> = opt_i64(smooth)?;
        let cycle_s: Option<String> =
            if cycle_metric.is_none() { None } else { Some(cycle_metric.extract()?) };
        let min_steps: i64 = min_steps.extract()?;
        let min_points: i64 = min_points.extract()?;
        let ready_points: i64 = ready_points.extract()?;
        let ramp_s: Option<String> =
            if after_warmup_of.is_none() { None } else { Some(after_warmup_of.extract()?) };
        let ramp_steps: i64 =
            if after_warmup_steps.is_none() { min_steps } else { after_warmup_steps.extract()? };
        let need_window = || {
            window_i.ok_or_else(|| PyTypeError::new_err(format!("{signal_s} needs a window")))
        };

        let mut core = lock(&self.core)?;
        let trk = core.track(py, &metric_s, smooth_i)?;
        let (mut win, mut other, mut cycle) = (NONE, NONE, NONE);
        match signal_s.as_str() {
            "ema" => {
                let w = need_window()?;
                let t = &mut core.tracks[trk];
                if !t.ema_spans.contains(&w) {
                    t.ema_spans.push(w);
                }
            }
            "follow_z" => {
                let w = need_window()?;
                win = core.window(trk, w, min_points);
                core.windows[win].need_mk();
                let name = cycle_s
                    .clone()
                    .ok_or_else(|| PyTypeError::new_err("follow_z needs a second metric"))?;
                let ot = core.track(py, &name, smooth_i)?;
                other = core.window(ot, w, min_points);
                core.windows[other].need_mk();
            }
            "gain_t" | "noise_ratio" | "shift_gain" | "trend_gain" | "drawdown_gain" => {
                let w = need_window()?;
                let b = if matches!(signal_s.as_str(), "shift_gain" | "trend_gain" | "drawdown_gain") {
                    START_STEPS
                } else {
                    w
                };
                let t = &mut core.tracks[trk];
                if !t.baselines.iter().any(|(k, _)| *k == b) {
                    t.baselines.push((b, Baseline::Collecting(Vec::new())));
                }
                win = core.window(trk, w, min_points);
                if signal_s == "trend_gain" {
                    core.windows[win].need_sums();
                }
                core.windows[win].need_sorted();
            }
            // the baseline alone: no level to keep
            "start" => {
                let w = need_window()?;
                let t = &mut core.tracks[trk];
                if !t.baselines.iter().any(|(k, _)| *k == w) {
                    t.baselines.push((w, Baseline::Collecting(Vec::new())));
                }
            }
            "ratio_to_start" | "start_z" | "ratio_to_start_max" => {
                let w = need_window()?;
                let t = &mut core.tracks[trk];
                if !t.baselines.iter().any(|(k, _)| *k == w) {
                    t.baselines.push((w, Baseline::Collecting(Vec::new())));
                }
                win = core.window(trk, LEVEL_STEPS, LEVEL_POINTS);
                core.windows[win].need_sorted();
            }
            "cycle_rise" => {
                let key = (metric_s.clone(), cycle_s.clone());
                cycle = match core.cycle_keys.get(&key) {
                    Some(&c) => c,
                    None => {
                        let c = core.cycles.len();
                        core.cycles.push(CycleRise {
                            metric: metric_s.clone(),
                            metric_py: PyString::intern_bound(py, &metric_s).unbind(),
                            cycle_metric: cycle_s.clone(),
                            cycle_metric_py: cycle_s
                                .as_deref()
                                .map(|s| PyString::intern_bound(py, s).unbind()),
                            start: NAN,
                            last_cycle: NAN,
                            out: NAN,
                            start_cycle: NAN,
                            last: NAN,
                            lo: NAN,
                            hi: NAN,
                            done: NAN,
                        });
                        core.cycle_keys.insert(key, c);
                        c
                    }
                };
            }
            "value" | "delta" => {
                core.tracks[trk].need(1, 2);
            }
            s => {
                let w = need_window()?;
                win = core.window(trk, w, min_points);
                let wd = &mut core.windows[win];
                if matches!(s, "mean" | "std" | "zscore" | "slope" | "rel_trend" | "flat_range") {
                    wd.need_sums();
                }
                if matches!(s, "trend_z" | "trend_tau") {
                    wd.need_mk();
                } else if matches!(
                    s,
                    "median"
                        | "min"
                        | "max"
                        | "range"
                        | "ratio_to_median"
                        | "robust_z"
                        | "rel_drop"
                        | "rel_rise"
                        | "flat_range"
                        | "rel_trend"
                        | "shift_z"
                        | "level_ratio"
                        | "shift_rel"
                        | "range_pos"
                        | "level_to_max"
                        | "over_max_z"
                        | "shift_dz"
                        | "jump_dz"
                        | "ratio_to_max"
                ) {
                    wd.need_sorted();
                }
            }
        }
        let sig = Sig::parse(&signal_s)
            .ok_or_else(|| PyValueError::new_err(format!("unknown signal {:?}", signal_s)))?;
        let ramp = ramp_s.map_or(NONE, |name| core.ramp(py, name));
        let spec = Spec {
            sig,
            trk,
            win,
            other,
            cycle,
            ramp,
            window: window_i.unwrap_or(0),
            need_points: ready_points.max(min_steps.min(5)),
            warm: 0i64.max(min_steps - 1),
            ramp_warm: 0i64.max(ramp_steps - 1),
        };
        let idx = core.readers.len();
        core.readers.push(ReaderDef { spec, memo_version: -1, memo: NAN });
        drop(core);
        let reader = Py::new(py, Reader { core: self.core.clone(), idx })?;
        readers.set_item(key, &reader)?;
        Ok(reader.into_py(py))
    }

    /// Push one step's metrics into the tracks that rules read.
    fn update(&self, py: Python<'_>, step: i64, metrics: &Bound<'_, PyDict>) -> PyResult<()> {
        let mut guard = lock(&self.core)?;
        let core = &mut *guard;
        core.step = step;
        core.version += 1;
        for (name, tracks) in &core.by_metric {
            if let Some(x) = metrics.get_item(name.bind(py))? {
                let x: f64 = x.extract()?;
                for &t in tracks {
                    core.tracks[t].push(py, step, x)?;
                }
            }
        }
        for cyc in core.cycles.iter_mut() {
            if let Some(x) = metrics.get_item(cyc.metric_py.bind(py))? {
                let x: f64 = x.extract()?;
                if x - x == 0.0 {
                    cyc.update(x, metrics)?;
                }
            }
        }
        for ramp in core.ramps.iter_mut() {
            if let Some(x) = metrics.get_item(ramp.metric_py.bind(py))? {
                let x: f64 = x.extract()?;
                if x - x == 0.0 {
                    ramp.update(step, x);
                }
            }
        }
        Ok(())
    }

    /// The EMA of each metric that rules read smoothed (the shortest span), as they read it.
    fn smoothed(&self, py: Python<'_>) -> PyResult<PyObject> {
        let core = lock(&self.core)?;
        let mut out: BTreeMap<String, (i64, f64)> = BTreeMap::new();
        for t in &core.tracks {
            let mut spans: Vec<(i64, f64)> = t.ema_spans.iter().map(|s| (*s, t.ema(*s))).collect();
            if let Some(s) = t.smooth {
                if s != 0 {
                    spans.push((s, t.smoothed()));
                }
            }
            for (span, v) in spans {
                if v == v {
                    let better = match out.get(&t.metric) {
                        None => true,
                        Some((s0, _)) => span < *s0,
                    };
                    if better {
                        out.insert(t.metric.clone(), (span, v));
                    }
                }
            }
        }
        let d = PyDict::new_bound(py);
        for (m, (_, v)) in out {
            d.set_item(m, v)?;
        }
        Ok(d.into_py(py))
    }

    fn to_state(&self, py: Python<'_>) -> PyResult<PyObject> {
        let core = lock(&self.core)?;
        let tracks = PyList::empty_bound(py);
        for t in &core.tracks {
            if t.n != 0 || t.last_step.is_some() {
                let item = PyList::empty_bound(py);
                item.append(&t.metric)?;
                item.append(t.smooth)?;
                item.append(t.to_state(py)?)?;
                tracks.append(item)?;
            }
        }
        let cycles = PyList::empty_bound(py);
        for c in &core.cycles {
            let vals = PyList::new_bound(py, c.values().map(|v| enc(py, v)));
            let item = PyList::empty_bound(py);
            item.append(&c.metric)?;
            item.append(&c.cycle_metric)?;
            item.append(vals)?;
            cycles.append(item)?;
        }
        let ramps = PyList::empty_bound(py);
        for r in &core.ramps {
            let item = PyList::empty_bound(py);
            item.append(&r.metric)?;
            item.append(enc(py, r.peak))?;
            item.append(r.step)?;
            ramps.append(item)?;
        }
        // when each autocorrelation was last worked out, and its value (as the Python bank)
        let autocorr = PyList::empty_bound(py);
        for w in &core.windows {
            if w.cache_at >= 0 {
                let t = &core.tracks[w.track];
                let item = PyList::empty_bound(py);
                item.append(&t.metric)?;
                item.append(t.smooth)?;
                item.append(w.steps_w)?;
                item.append(w.cache_at)?;
                item.append(enc(py, w.cache_ac.unwrap_or(NAN)))?;
                autocorr.append(item)?;
            }
        }
        let d = PyDict::new_bound(py);
        d.set_item("tracks", tracks)?;
        d.set_item("cycles", cycles)?;
        d.set_item("ramps", ramps)?;
        d.set_item("autocorr", autocorr)?;
        Ok(d.into_py(py))
    }

    /// `to_state()` as MessagePack bytes, byte for byte what `msgspec.msgpack.encode` makes of
    /// it, written without building the Python objects (a run's state is written to the
    /// worker's table before each offset commit and each alert).
    fn to_msgpack(&self, py: Python<'_>) -> PyResult<PyObject> {
        let core = lock(&self.core)?;
        let mut mp = Mp(Vec::with_capacity(32 * 1024));
        mp.map(4);
        mp.str("tracks");
        let kept: Vec<&Track> =
            core.tracks.iter().filter(|t| t.n != 0 || t.last_step.is_some()).collect();
        mp.array(kept.len());
        for t in kept {
            mp.array(3);
            mp.str(&t.metric);
            mp.opt_int(t.smooth);
            t.to_msgpack(&mut mp);
        }
        mp.str("cycles");
        mp.array(core.cycles.len());
        for c in &core.cycles {
            mp.array(3);
            mp.str(&c.metric);
            match &c.cycle_metric {
                Some(m) => mp.str(m),
                None => mp.nil(),
            }
            let vals = c.values();
            mp.array(vals.len());
            for v in vals {
                mp.enc(v);
            }
        }
        mp.str("ramps");
        mp.array(core.ramps.len());
        for r in &core.ramps {
            mp.array(3);
            mp.str(&r.metric);
            mp.enc(r.peak);
            mp.opt_int(r.step);
        }
        mp.str("autocorr");
        let cached: Vec<&Window> = core.windows.iter().filter(|w| w.cache_at >= 0).collect();
        mp.array(cached.len());
        for w in cached {
            let t = &core.tracks[w.track];
            mp.array(5);
            mp.str(&t.metric);
            mp.opt_int(t.smooth);
            mp.int(w.steps_w);
            mp.int(w.cache_at);
            mp.enc(w.cache_ac.unwrap_or(NAN));
        }
        Ok(pyo3::types::PyBytes::new_bound(py, &mp.0).into_py(py))
    }

    /// Restore values into the tracks this bank was compiled with (others are dropped).
    fn load(&self, state: &Bound<'_, PyAny>) -> PyResult<()> {
        let mut core = lock(&self.core)?;
        core.version += 1;
        let empty = PyList::empty_bound(state.py());
        let tracks = state.call_method1("get", ("tracks", &empty))?;
        for item in tracks.iter()? {
            let item = item?;
            let m = item.get_item(0)?;
            let s = item.get_item(1)?;
            let st = item.get_item(2)?;
            if item.len()? != 3 {
                return Err(PyValueError::new_err("a track of a state is [metric, smooth, state]"));
            }
            let Ok(m) = m.extract::<String>() else { continue };
            let Some(s) = key_smooth(&s) else { continue };
            if let Some(&i) = core.track_keys.get(&(m, s)) {
                core.tracks[i].load(&st)?;
            }
        }
        let cycles = state.call_method1("get", ("cycles", &empty))?;
        for item in cycles.iter()? {
            let item = item?;
            let m = item.get_item(0)?;
            let c = item.get_item(1)?;
            let vals = item.get_item(2)?;
            // eight values; a state of an older worker holds the first three (no ended cycle
            // counted: the next one that ends is)
            let n = vals.len()?;
            if n != 3 && n != 8 {
                return Err(PyValueError::new_err("a cycle of a state holds three or eight values"));
            }
            let mut v = [NAN; 8];
            for (k, slot) in v.iter_mut().enumerate().take(n) {
                *slot = dec(&vals.get_item(k)?)?;
            }
            let Ok(m) = m.extract::<String>() else { continue };
            let c: Option<String> = if c.is_none() {
                None
            } else {
                match c.extract::<String>() {
                    Ok(c) => Some(c),
                    Err(_) => continue,
                }
            };
            if let Some(&i) = core.cycle_keys.get(&(m, c)) {
                let x = &mut core.cycles[i];
                [x.start, x.last_cycle, x.out, x.start_cycle, x.last, x.lo, x.hi, x.done] = v;
            }
        }
        // none in a state of an older worker
        let ramps = state.call_method1("get", ("ramps", &empty))?;
        for item in ramps.iter()? {
            let item = item?;
            if item.len()? != 3 {
                return Err(PyValueError::new_err("a ramp of a state is [metric, peak, step]"));
            }
            let peak = dec(&item.get_item(1)?)?;
            let at = item.get_item(2)?;
            let at: Option<i64> = if at.is_none() { None } else { Some(at.extract()?) };
            let Ok(m) = item.get_item(0)?.extract::<String>() else { continue };
            if let Some(&i) = core.ramp_keys.get(&m) {
                let r = &mut core.ramps[i];
                r.peak = peak;
                r.step = at;
            }
        }
        let autocorr = state.call_method1("get", ("autocorr", &empty))?;
        for item in autocorr.iter()? {
            let item = item?;
            if item.len()? != 5 {
                return Err(PyValueError::new_err(
                    "an autocorrelation of a state is [metric, smooth, window, at, value]",
                ));
            }
            let Ok(m) = item.get_item(0)?.extract::<String>() else { continue };
            let Some(s) = key_smooth(&item.get_item(1)?) else { continue };
            let steps: i64 = item.get_item(2)?.extract()?;
            let at: i64 = item.get_item(3)?.extract()?;
            let ac = dec(&item.get_item(4)?)?;
            // the autocorrelation's window: of those of (metric, smooth, steps), the one with
            // the most points (as the Python bank)
            let mut best: Option<(i64, usize)> = None;
            for (k, &w) in core.window_keys.iter() {
                if k.0 == m && k.1 == s && k.2 == steps && best.map_or(true, |(p, _)| k.3 > p) {
                    best = Some((k.3, w));
                }
            }
            if let Some((_, w)) = best {
                let win = &mut core.windows[w];
                win.cache_at = at;
                win.cache_ac = Some(ac);
            }
        }
        Ok(())
    }
}

#[pymodule]
#[pyo3(name = "_native")]
fn native_module(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Bank>()?;
    m.add_class::<Reader>()?;
    m.add_class::<TrackView>()?;
    m.add_function(wrap_pyfunction!(dists::spearman, m)?)?;
    m.add_class::<dists::Moments>()?;
    m.add_class::<dists::Series>()?;
    m.add_function(wrap_pyfunction!(dists::update_group, m)?)?;
    m.add_class::<logic::Compare>()?;
    m.add_class::<logic::Node>()?;
    m.add_function(wrap_pyfunction!(logic::join, m)?)?;
    m.add_class::<logic::Scan>()?;
    m.add_class::<logic::CallCompare>()?;
    m.add_function(wrap_pyfunction!(logic::compare_call, m)?)?;
    m.add_function(wrap_pyfunction!(text::repetition_score, m)?)?;
    m.add_class::<ranks::RankBuffer>()?;
    m.add_class::<ranks::RankStat>()?;
    m.add_class::<ranks::HashMismatch>()?;
    m.add_class::<view::StepView>()?;
    m.add_class::<view::DistStat>()?;
    m.add_class::<view::GroupStat>()?;
    m.add_class::<view::NonFinite>()?;
    m.add_class::<view::NonFiniteTest>()?;
    m.add_class::<wire::RankStep>()?;
    m.add_function(wrap_pyfunction!(wire::read_rank_step, m)?)?;
    m.add_class::<routine::Routine>()?;
    Ok(())
}
