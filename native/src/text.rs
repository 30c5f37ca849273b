//! `repetition_score` of `streams/text.py` (the `degenerate_text` rule's measure) in Rust.
//!
//! The Python function `streams.text.py_repetition_score` is the reference: this one gives the
//! same float for every input. It follows the Python step by step:
//!
//! * `text.split()` splits on Python's whitespace (`str.isspace`, CPython's
//!   `Py_UNICODE_ISSPACE`), which is not Rust's `char::is_whitespace`: see [`is_py_space`];
//! * `len(text)` and `text[i:i + 4]` count code points: the string is read in CPython's own
//!   storage (one, two or four bytes per code point), so lone surrogates are code points too;
//! * the n-grams are compared as tuples of strings (equal when every word is equal, code point
//!   for code point);
//! * `1.0 - len(set(grams)) / len(grams)`: the int / int division is correctly rounded, which
//!   a double division of the two counts (exact below 2**53) is, then the same subtraction;
//! * `n <= 0`: the Python has no n-grams to divide by and raises ZeroDivisionError (unless it
//!   returns 0.0 first); so does this one.
//!
//! Inputs outside the fast path (a `text` that is not exactly a `str`, an `n` that is not
//! exactly an `int` fitting 64 bits) are handed to the Python reference, so they behave exactly
//! as it does (errors included).

use pyo3::exceptions::PyZeroDivisionError;
use pyo3::prelude::*;
use pyo3::types::{PyLong, PyString, PyStringData};
use std::cell::RefCell;
use std::collections::hash_map::Entry;
use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasherDefault, Hash, Hasher};

/// `str.isspace()` of CPython 3.11 (Unicode 14): the ASCII table (`\t\n\v\f\r`, `\x1c`-`\x1f`,
/// space) and the characters of bidirectional type WS, B or S or category Zs. Unlike
/// `char::is_whitespace` it includes `\x1c`-`\x1f` and excludes nothing else it lists.
#[inline]
fn is_py_space(c: u32) -> bool {
    matches!(
        c,
        0x09..=0x0D
            | 0x1C..=0x20
            | 0x85
            | 0xA0
            | 0x1680
            | 0x2000..=0x200A
            | 0x2028
            | 0x2029
            | 0x202F
            | 0x205F
            | 0x3000
    )
}

/// A small multiplicative hasher (the Fx hash of the Rust compiler): the keys here are short
/// slices of integers from one string, no adversary gains anything by colliding them beyond
/// slowing their own sample down.
#[derive(Default, Clone, Copy)]
struct Fx(u64);

const FX_K: u64 = 0x517c_c1b7_2722_0a95;

impl Fx {
    #[inline]
    fn add(&mut self, w: u64) {
        self.0 = (self.0.rotate_left(5) ^ w).wrapping_mul(FX_K);
    }
}

impl Hasher for Fx {
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            self.add(u64::from_le_bytes(c.try_into().unwrap()));
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            let mut b = [0u8; 8];
            b[..rest.len()].copy_from_slice(rest);
            self.add(u64::from_le_bytes(b));
        }
    }
    #[inline]
    fn write_u32(&mut self, i: u32) {
        self.add(i as u64);
    }
    #[inline]
    fn write_u64(&mut self, i: u64) {
        self.add(i);
    }
    #[inline]
    fn write_usize(&mut self, i: usize) {
        self.add(i as u64);
    }
    #[inline]
    fn finish(&self) -> u64 {
        // the product's low bits depend only on the input's low bits (the first characters of a
        // word), and the table picks buckets by the low bits: move the well-mixed high bits down
        self.0.rotate_left(26)
    }
}

type FxBuild = BuildHasherDefault<Fx>;

/// The score of one string given as its code points, or `None` where the Python divides by zero.
fn score<T: Copy + Eq + Hash + Into<u32>>(s: &[T], n: i64) -> Option<f64> {
    let n = n as i128;
    // text.split(): maximal runs of non-space code points
    let mut words: Vec<(usize, usize)> = Vec::new();
    let mut start: Option<usize> = None;
    for (i, &c) in s.iter().enumerate() {
        if is_py_space(c.into()) {
            if let Some(b) = start.take() {
                words.push((b, i));
            }
        } else if start.is_none() {
            start = Some(i);
        }
    }
    if let Some(b) = start {
        words.push((b, s.len()));
    }
    // few words in a long text: 4-code-point chunks, the last one shorter
    if (words.len() as i128) < n + 2 && s.len() >= 40 {
        words = (0..s.len()).step_by(4).map(|i| (i, (i + 4).min(s.len()))).collect();
    }
    if (words.len() as i128) < n + 1 {
        return Some(0.0);
    }
    if n <= 0 {
        return None; // no n-grams: 0 / 0
    }
    let n = n as usize; // here 1 <= n < len(words)
    // each distinct word an id, then the distinct windows of n ids
    let mut seen: HashMap<&[T], u32, FxBuild> =
        HashMap::with_capacity_and_hasher(words.len(), FxBuild::default());
    let ids: Vec<u32> = words
        .iter()
        .map(|&(a, b)| {
            let next = seen.len() as u32;
            *seen.entry(&s[a..b]).or_insert(next)
        })
        .collect();
    let total = ids.len() - n + 1;
    let distinct = if n == 1 {
        seen.len()
    } else if n <= 3 && seen.len() < (1 << 21) {
        // two or three ids of 21 bits packed in one integer key
        let mut grams: HashSet<u64, FxBuild> =
            HashSet::with_capacity_and_hasher(total, FxBuild::default());
        for w in ids.windows(n) {
            grams.insert(w.iter().fold(0u64, |k, &id| (k << 21) | id as u64));
        }
        grams.len()
    } else {
        let mut grams: HashSet<&[u32], FxBuild> =
            HashSet::with_capacity_and_hasher(total, FxBuild::default());
        for w in ids.windows(n) {
            grams.insert(w);
        }
        grams.len()
    };
    Some(1.0 - distinct as f64 / total as f64)
}

/// What [`score_fast`] keeps from one text to the next (emptied, and let go after a text of an
/// unusual size: [`Scratch::trim`]): no allocation per text.
#[derive(Default)]
struct Scratch {
    /// each word: its span and the Fx hash of its code points
    words: Vec<(u32, u32, u64)>,
    /// the id of each word, then the spans of each id's first word
    ids: Vec<u32>,
    first: Vec<(u32, u32)>,
    by_hash: HashMap<u64, u32, FxBuild>,
    grams: HashSet<u64, FxBuild>,
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
}

/// The Fx hash of a word's code points.
#[inline]
fn word_hash<T: Copy + Into<u32>>(w: &[T]) -> u64 {
    let mut h = Fx::default();
    for &c in w {
        h.add(c.into() as u64);
    }
    h.add(w.len() as u64);
    h.finish()
}

/// [`score`] without a map keyed by slices: each word is known by the hash of its code points,
/// checked against the first word of that hash. `None` where it cannot say (two different
/// words of one hash, more than 2**21 distinct words, n-grams of more than three words): then
/// [`score`] decides. Gives what [`score`] gives otherwise.
fn score_fast<T: Copy + Eq + Into<u32>>(s: &[T], n: i64, sc: &mut Scratch) -> Option<Option<f64>> {
    if s.len() >= u32::MAX as usize {
        return None;
    }
    let nn = n as i128;
    let words = &mut sc.words;
    words.clear();
    let mut start: Option<usize> = None;
    let mut h = Fx::default();
    for (i, &c) in s.iter().enumerate() {
        let c = c.into();
        if is_py_space(c) {
            if let Some(b) = start.take() {
                h.add((i - b) as u64);
                words.push((b as u32, i as u32, h.finish()));
            }
        } else {
            if start.is_none() {
                start = Some(i);
                h = Fx::default();
            }
            h.add(c as u64);
        }
    }
    if let Some(b) = start {
        h.add((s.len() - b) as u64);
        words.push((b as u32, s.len() as u32, h.finish()));
    }
    if (words.len() as i128) < nn + 2 && s.len() >= 40 {
        words.clear();
        for i in (0..s.len()).step_by(4) {
            let e = (i + 4).min(s.len());
            words.push((i as u32, e as u32, word_hash(&s[i..e])));
        }
    }
    if (words.len() as i128) < nn + 1 {
        return Some(Some(0.0));
    }
    if n <= 0 {
        return Some(None);
    }
    let n = n as usize;
    if n > 3 {
        return None;
    }
    sc.by_hash.clear();
    sc.first.clear();
    sc.ids.clear();
    for &(a, b, h) in words.iter() {
        let id = match sc.by_hash.entry(h) {
            Entry::Occupied(e) => {
                let id = *e.get();
                let (fa, fb) = sc.first[id as usize];
                if s[fa as usize..fb as usize] != s[a as usize..b as usize] {
                    return None;
                }
                id
            }
            Entry::Vacant(e) => {
                let id = sc.first.len() as u32;
                sc.first.push((a, b));
                e.insert(id);
                id
            }
        };
        sc.ids.push(id);
    }
    let distinct_words = sc.first.len();
    let total = sc.ids.len() - n + 1;
    let distinct = if n == 1 {
        distinct_words
    } else if distinct_words < (1 << 21) {
        sc.grams.clear();
        for w in sc.ids.windows(n) {
            sc.grams.insert(w.iter().fold(0u64, |k, &id| (k << 21) | id as u64));
        }
        sc.grams.len()
    } else {
        return None;
    };
    Some(Some(1.0 - distinct as f64 / total as f64))
}

impl Scratch {
    /// Let go of what an unusual text grew (rather than keep it, and empty it at every text).
    fn trim(&mut self) {
        if self.words.capacity() > 1 << 16 || self.by_hash.capacity() > 1 << 16 {
            *self = Scratch::default();
        }
    }
}

/// [`score_fast`], else [`score`].
fn score_any<T: Copy + Eq + Hash + Into<u32>>(s: &[T], n: i64) -> Option<f64> {
    let fast = SCRATCH.with(|sc| match sc.try_borrow_mut() {
        Ok(mut sc) => {
            let got = score_fast(s, n, &mut sc);
            sc.trim();
            got
        }
        Err(_) => None,
    });
    match fast {
        Some(r) => r,
        None => score(s, n),
    }
}

/// `n`: an exact int within 64 bits (the fast path), or anything else (the Python decides).
pub enum GramSize<'py> {
    Int(i64),
    Other(Bound<'py, PyAny>),
}

impl<'py> FromPyObject<'py> for GramSize<'py> {
    fn extract_bound(ob: &Bound<'py, PyAny>) -> PyResult<Self> {
        if ob.is_exact_instance_of::<PyLong>() {
            if let Ok(v) = ob.extract::<i64>() {
                return Ok(GramSize::Int(v));
            }
        }
        Ok(GramSize::Other(ob.clone()))
    }
}

/// Share of repeated word n-grams in `text` (0 = all distinct, near 1 = a loop): the Python
/// `streams.text.py_repetition_score`, bit for bit.
#[pyfunction]
#[pyo3(signature = (text, n = GramSize::Int(3)))]
pub fn repetition_score(
    py: Python<'_>,
    text: &Bound<'_, PyAny>,
    n: GramSize<'_>,
) -> PyResult<PyObject> {
    if let (Ok(s), GramSize::Int(k)) = (text.downcast_exact::<PyString>(), &n) {
        // SAFETY: a str is immutable; the slice is read while `text` holds it alive.
        let r = unsafe {
            match s.data()? {
                PyStringData::Ucs1(d) => score_any(d, *k),
                PyStringData::Ucs2(d) => score_any(d, *k),
                PyStringData::Ucs4(d) => score_any(d, *k),
            }
        };
        return match r {
            Some(x) => Ok(x.into_py(py)),
            None => Err(PyZeroDivisionError::new_err("division by zero")),
        };
    }
    let n = match n {
        GramSize::Int(k) => k.into_py(py),
        GramSize::Other(o) => o.unbind(),
    };
    let reference = py.import_bound("streams.text")?.getattr("py_repetition_score")?;
    Ok(reference.call1((text, n))?.unbind())
}
