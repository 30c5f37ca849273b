//! The commonest event of a fleet, a step of a rank other than 0, read straight from its JSON
//! bytes (`streams.run.read_rank_step`). A fast path of `contract.events.read_event` for that
//! one shape: it takes only what is plainly valid under the contract and plainly routine, and
//! gives None for anything else (an escape or a non-ASCII byte in a text, an integral float,
//! dists, an unknown or repeated key, a value at a limit's edge, rank 0...), which then takes
//! `read_event`, the one that words every rejection. What it takes, it reads as `read_event`
//! does: the same numbers (correctly rounded, as msgspec's; a metric's text that spells a
//! non-finite value, as a diverged run sends them, read as that value), the same texts.

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyFloat, PyList, PyString};

// the limits of contract/events.py
const MAX_NAME_LEN: usize = 256;
const MAX_METRICS: usize = 4096;
const MAX_TAGS: usize = 64;
const MAX_TAG_VALUE_LEN: usize = 1024;
const MAX_RUN_ID_LEN: usize = 256;
const MAX_INCARNATION_LEN: usize = 64;
const MAX_STEP: i64 = 1 << 53;
const MAX_RANK: i64 = 1_000_000;
const MAX_WORLD: i64 = 1_000_000;
const MAX_EVENT_BYTES: usize = 1_000_000;

pub(crate) type Span = (u32, u32);

const ONES: u64 = 0x0101_0101_0101_0101;
const HIGHS: u64 = 0x8080_8080_8080_8080;

/// The high bit of each byte of `v` that `Reader::text` does not take without a second look (a
/// byte outside printable ASCII, `"` or `\\`), at least for the first such byte: a flag above
/// a flagged byte may be false (a borrow), the lowest one never is.
#[inline]
fn special8(v: u64) -> u64 {
    // a byte under 0x20: subtracting 0x20 borrows into its high bit (bytes of 0x80 and over
    // are flagged by the high-bit test)
    let low = v.wrapping_sub(0x20 * ONES) & !v & HIGHS;
    let zero = |x: u64| x.wrapping_sub(ONES) & !x & HIGHS;
    (v & HIGHS) | low | zero(v ^ (0x7f * ONES)) | zero(v ^ (b'"' as u64 * ONES)) | zero(v ^ (b'\\' as u64 * ONES))
}

struct Reader<'a> {
    b: &'a [u8],
    i: usize,
}

impl<'a> Reader<'a> {
    #[inline]
    fn ws(&mut self) {
        while let Some(&c) = self.b.get(self.i) {
            if c == b' ' || c == b'\t' || c == b'\n' || c == b'\r' {
                self.i += 1;
            } else {
                break;
            }
        }
    }

    #[inline]
    fn eat(&mut self, c: u8) -> Option<()> {
        self.ws();
        if self.b.get(self.i) == Some(&c) {
            self.i += 1;
            Some(())
        } else {
            None
        }
    }

    #[inline]
    fn peek(&mut self) -> Option<u8> {
        self.ws();
        self.b.get(self.i).copied()
    }

    /// A text of printable ASCII without escapes: its span (anything else: None).
    fn text(&mut self) -> Option<Span> {
        self.eat(b'"')?;
        let start = self.i;
        // eight bytes at a time: the first byte that is not plain ends the text (`"`) or
        // refuses it
        while let Some(chunk) = self.b.get(self.i..self.i + 8) {
            let m = special8(u64::from_le_bytes(chunk.try_into().unwrap()));
            if m == 0 {
                self.i += 8;
                continue;
            }
            self.i += (m.trailing_zeros() / 8) as usize;
            if self.b[self.i] != b'"' {
                return None;
            }
            self.i += 1;
            return Some((start as u32, (self.i - 1) as u32));
        }
        // (the last bytes of the event, fewer than eight)
        while let Some(&c) = self.b.get(self.i) {
            if c == b'"' {
                self.i += 1;
                return Some((start as u32, (self.i - 1) as u32));
            }
            if !(0x20..0x7f).contains(&c) || c == b'\\' {
                return None;
            }
            self.i += 1;
        }
        None
    }

    #[inline]
    fn bytes_of(&self, s: Span) -> &'a [u8] {
        &self.b[s.0 as usize..s.1 as usize]
    }

    /// The text of a JSON number and whether it is written as an integer.
    fn number(&mut self) -> Option<(&'a [u8], bool)> {
        self.ws();
        let b = self.b;
        let start = self.i;
        let digits = |r: &mut Self| {
            let d = r.i;
            while b.get(r.i).map_or(false, |c| c.is_ascii_digit()) {
                r.i += 1;
            }
            r.i > d
        };
        if b.get(self.i) == Some(&b'-') {
            self.i += 1;
        }
        match b.get(self.i) {
            Some(b'0') => self.i += 1,
            Some(c) if c.is_ascii_digit() => {
                digits(self);
            }
            _ => return None,
        }
        let mut integer = true;
        if b.get(self.i) == Some(&b'.') {
            integer = false;
            self.i += 1;
            if !digits(self) {
                return None;
            }
        }
        if matches!(b.get(self.i), Some(b'e') | Some(b'E')) {
            integer = false;
            self.i += 1;
            if matches!(b.get(self.i), Some(b'+') | Some(b'-')) {
                self.i += 1;
            }
            if !digits(self) {
                return None;
            }
        }
        let t = &b[start..self.i];
        if t == b"-0" {
            return None; // (which zero it reads as is not worth the doubt)
        }
        Some((t, integer))
    }

    /// An integer written as one, in [lo, hi].
    fn int(&mut self, lo: i64, hi: i64) -> Option<i64> {
        let (t, integer) = self.number()?;
        if !integer || t.len() > 18 {
            return None;
        }
        let (neg, digits) = if t[0] == b'-' { (true, &t[1..]) } else { (false, t) };
        let mut v: i64 = 0;
        for &c in digits {
            v = v * 10 + (c - b'0') as i64;
        }
        if neg {
            v = -v;
        }
        if v < lo || v > hi {
            None
        } else {
            Some(v)
        }
    }

    /// A finite number (an integer of at most 15 digits, or a decimal of at most 24
    /// characters: the longest shortest form of a double), read as a float.
    fn float(&mut self) -> Option<f64> {
        let (t, integer) = self.number()?;
        if (integer && t.len() - (t[0] == b'-') as usize > 15) || t.len() > 24 {
            return None;
        }
        // (a JSON number's text is ASCII)
        let x: f64 = unsafe { std::str::from_utf8_unchecked(t) }.parse().ok()?;
        if !x.is_finite() {
            return None;
        }
        if x == 0.0 {
            // an underflow to zero is left to msgspec
            let mantissa = t.split(|&c| c == b'e' || c == b'E').next().unwrap_or(b"");
            if mantissa.iter().any(|c| (b'1'..=b'9').contains(c)) {
                return None;
            }
        }
        Some(x)
    }

    /// A metric's value: a number as `float` reads it, or a text that spells a non-finite
    /// value as `contract.events` reads one (`_NONFINITE_IN`, its spaces stripped and its case
    /// ignored: a diverged run sends "NaN" in every event).
    fn value(&mut self) -> Option<f64> {
        if self.peek()? != b'"' {
            return self.float();
        }
        let t = self.text()?;
        let mut word = self.bytes_of(t);
        while let [b' ', rest @ ..] = word {
            word = rest;
        }
        while let [rest @ .., b' '] = word {
            word = rest;
        }
        let word = word.to_ascii_lowercase();
        match word.as_slice() {
            b"nan" | b"+nan" | b"-nan" => Some(f64::NAN),
            b"inf" | b"+inf" | b"infinity" | b"+infinity" => Some(f64::INFINITY),
            b"-inf" | b"-infinity" => Some(f64::NEG_INFINITY),
            _ => None,
        }
    }

    fn null(&mut self) -> bool {
        self.ws();
        if self.b[self.i..].starts_with(b"null") {
            self.i += 4;
            true
        } else {
            false
        }
    }

    /// An object, its members read by `member` (which gets the name's span), each name once.
    fn object(&mut self, mut member: impl FnMut(&mut Self, Span) -> Option<()>) -> Option<usize> {
        self.eat(b'{')?;
        if self.peek()? == b'}' {
            self.i += 1;
            return Some(0);
        }
        let mut n = 0;
        loop {
            let name = self.text()?;
            self.eat(b':')?;
            member(self, name)?;
            n += 1;
            self.ws();
            match self.b.get(self.i)? {
                b',' => self.i += 1,
                b'}' => {
                    self.i += 1;
                    return Some(n);
                }
                _ => return None,
            }
        }
    }

    /// An object of name -> text within the contract's limits for tags and hashes.
    fn strings(&mut self, out: &mut Vec<(Span, Span)>) -> Option<()> {
        let n = self.object(|r, name| {
            let v = r.text()?;
            if (name.1 - name.0) as usize > MAX_NAME_LEN || (v.1 - v.0) as usize > MAX_TAG_VALUE_LEN {
                return None;
            }
            out.push((name, v));
            Some(())
        })?;
        if n > MAX_TAGS {
            None
        } else {
            Some(())
        }
    }
}

fn has_repeats(b: &[u8], names: impl Iterator<Item = Span> + Clone) -> bool {
    let n = names.clone().count();
    if n <= 24 {
        // (no vector for the few names of a usual step)
        let text = |s: Span| &b[s.0 as usize..s.1 as usize];
        for (i, a) in names.clone().enumerate() {
            if names.clone().take(i).any(|x| text(x) == text(a)) {
                return true;
            }
        }
        false
    } else {
        let all: Vec<&[u8]> = names.map(|s| &b[s.0 as usize..s.1 as usize]).collect();
        let mut seen = std::collections::HashSet::with_capacity(all.len());
        !all.iter().all(|n| seen.insert(*n))
    }
}

pub(crate) struct Parsed {
    pub(crate) run_id: Span,
    pub(crate) rank: i64,
    pub(crate) step: i64,
    pub(crate) world_size: Option<i64>,
    pub(crate) ts: Option<f64>,
    pub(crate) incarnation: Option<Span>,
    pub(crate) tags: Span,
    pub(crate) metrics: Vec<(Span, f64)>,
    pub(crate) hashes: Vec<(Span, Span)>,
    pub(crate) batch_ids: Vec<Span>,
    pub(crate) tag_items: Vec<(Span, Span)>,
}

impl Parsed {
    /// Whether every metric is finite.
    pub(crate) fn finite(&self) -> bool {
        self.metrics.iter().all(|m| m.1.is_finite())
    }
}

const SCHEMA: u32 = 1;
const KIND: u32 = 2;
const RUN_ID: u32 = 4;
const STEP: u32 = 8;
const RANK: u32 = 16;

pub(crate) fn parse(b: &[u8]) -> Option<Parsed> {
    if b.len() > MAX_EVENT_BYTES {
        return None;
    }
    let mut r = Reader { b, i: 0 };
    let mut p = Parsed {
        run_id: (0, 0),
        rank: 0,
        step: 0,
        world_size: None,
        ts: None,
        incarnation: None,
        tags: (0, 0),
        // room for a rank's usual step (a handful of metrics, a hash, a few batch ids): no
        // growing on the way
        metrics: Vec::with_capacity(8),
        hashes: Vec::with_capacity(2),
        batch_ids: Vec::with_capacity(8),
        tag_items: Vec::new(),
    };
    let mut seen: u32 = 0;
    let mut tags_seen = false;
    r.object(|r, name| {
        let (bit, _) = match r.bytes_of(name) {
            b"schema" => (SCHEMA, r.int(1, 1)?),
            b"kind" => {
                let k = r.text()?;
                if r.bytes_of(k) != b"step" {
                    return None;
                }
                (KIND, 0)
            }
            b"run_id" => {
                let s = r.text()?;
                let len = (s.1 - s.0) as usize;
                // no whitespace: printable ASCII but the space
                if len == 0 || len > MAX_RUN_ID_LEN || r.bytes_of(s).contains(&b' ') {
                    return None;
                }
                p.run_id = s;
                (RUN_ID, 0)
            }
            b"step" => {
                p.step = r.int(0, MAX_STEP)?;
                (STEP, 0)
            }
            b"rank" => {
                p.rank = r.int(1, MAX_RANK)?; // rank 0: the Python paths
                (RANK, 0)
            }
            b"world_size" => {
                if !r.null() {
                    p.world_size = Some(r.int(1, MAX_WORLD)?);
                }
                (32, 0)
            }
            b"ts" => {
                if !r.null() {
                    p.ts = Some(r.float()?);
                }
                (64, 0)
            }
            b"incarnation" => {
                if !r.null() {
                    let s = r.text()?;
                    let len = (s.1 - s.0) as usize;
                    if len == 0 || len > MAX_INCARNATION_LEN || r.bytes_of(s).contains(&b' ') {
                        return None;
                    }
                    p.incarnation = Some(s);
                }
                (128, 0)
            }
            b"tags" => {
                r.ws();
                let start = r.i as u32;
                r.strings(&mut p.tag_items)?;
                p.tags = (start, r.i as u32);
                tags_seen = !p.tag_items.is_empty();
                (256, 0)
            }
            b"metrics" => {
                let metrics = &mut p.metrics;
                let n = r.object(|r, name| {
                    if (name.1 - name.0) as usize > MAX_NAME_LEN {
                        return None;
                    }
                    metrics.push((name, r.value()?));
                    Some(())
                })?;
                if n > MAX_METRICS {
                    return None;
                }
                (512, 0)
            }
            b"dists" | b"groups" => {
                // only empty ones (a rank's steps have none)
                if r.object(|_, _| None)? != 0 {
                    return None;
                }
                (if r.bytes_of(name) == b"dists" { 1024 } else { 2048 }, 0)
            }
            b"hashes" => {
                r.strings(&mut p.hashes)?;
                (4096, 0)
            }
            b"batch_ids" => {
                r.eat(b'[')?;
                if r.peek()? == b']' {
                    r.i += 1;
                } else {
                    loop {
                        let id = r.text()?;
                        p.batch_ids.push(id);
                        r.ws();
                        match r.b.get(r.i)? {
                            b',' => r.i += 1,
                            b']' => {
                                r.i += 1;
                                break;
                            }
                            _ => return None,
                        }
                    }
                }
                (8192, 0)
            }
            _ => return None,
        };
        if seen & bit != 0 {
            return None; // a repeated key
        }
        seen |= bit;
        Some(())
    })?;
    r.ws();
    if r.i != b.len() || seen & (SCHEMA | KIND | RUN_ID | STEP | RANK) != SCHEMA | KIND | RUN_ID | STEP | RANK {
        return None;
    }
    if has_repeats(b, p.metrics.iter().map(|m| m.0)) || has_repeats(b, p.hashes.iter().map(|h| h.0)) {
        return None;
    }
    if !tags_seen {
        p.tags = (0, 0);
    }
    Some(p)
}

/// A step of a rank other than 0 as `read_rank_step` read it: what the run's bookkeeping
/// needs, and (for the cross-rank buffer) its metrics and hashes, read from the event's bytes.
#[pyclass(module = "streams._native", frozen)]
pub struct RankStep {
    #[pyo3(get)]
    pub(crate) run_id: Py<PyString>,
    #[pyo3(get)]
    pub(crate) rank: i64,
    #[pyo3(get)]
    pub(crate) step: i64,
    #[pyo3(get)]
    pub(crate) world_size: Option<i64>,
    #[pyo3(get)]
    pub(crate) ts: Option<f64>,
    #[pyo3(get)]
    pub(crate) incarnation: Option<Py<PyString>>,
    /// the bytes of the tags object as written (empty when the event has none, or none in it)
    #[pyo3(get)]
    pub(crate) tags_json: Py<PyBytes>,
    /// the event has metrics
    #[pyo3(get)]
    pub(crate) has_metrics: bool,
    /// every metric is finite (a text spelling a non-finite value reads as that value)
    #[pyo3(get)]
    pub(crate) finite: bool,
    pub(crate) raw: Py<PyBytes>,
    pub(crate) metrics: Vec<(Span, f64)>,
    pub(crate) hashes: Vec<(Span, Span)>,
    pub(crate) batch_ids: Vec<Span>,
    pub(crate) tag_items: Vec<(Span, Span)>,
}

impl RankStep {
    /// The step `p` read from `raw`, with its run id, incarnation and tags object as given.
    pub(crate) fn of(raw: &Bound<'_, PyBytes>, p: Parsed, run_id: Py<PyString>,
                     incarnation: Option<Py<PyString>>, tags_json: Py<PyBytes>) -> RankStep {
        let finite = p.finite();
        RankStep {
            run_id,
            rank: p.rank,
            step: p.step,
            world_size: p.world_size,
            ts: p.ts,
            incarnation,
            tags_json,
            tag_items: p.tag_items,
            has_metrics: !p.metrics.is_empty(),
            finite,
            raw: raw.clone().unbind(),
            metrics: p.metrics,
            hashes: p.hashes,
            batch_ids: p.batch_ids,
        }
    }

    /// The tags as `read_event` gives them (a dict of name -> text).
    pub(crate) fn tags_dict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        self.strings(py, &self.tag_items)
    }

    pub fn step(&self) -> i64 {
        self.step
    }

    pub fn rank(&self) -> i64 {
        self.rank
    }

    /// The value of metric `name`, when the step has it.
    pub fn metric(&self, py: Python<'_>, name: &str) -> Option<f64> {
        let b = self.raw.as_bytes(py);
        let name = name.as_bytes();
        self.metrics
            .iter()
            .find(|(s, _)| &b[s.0 as usize..s.1 as usize] == name)
            .map(|m| m.1)
    }

    /// The bytes of hash `name`, when the step has it (printable ASCII: the reader took no
    /// other text).
    pub fn hash_bytes<'a>(&'a self, py: Python<'_>, name: &[u8]) -> Option<&'a [u8]> {
        let b = self.raw.as_bytes(py);
        self.hashes
            .iter()
            .find(|(k, _)| &b[k.0 as usize..k.1 as usize] == name)
            .map(|(_, v)| &b[v.0 as usize..v.1 as usize])
    }

    /// The hashes as `read_event` gives them (a dict of name -> hash).
    pub fn hashes_dict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        self.strings(py, &self.hashes)
    }

    fn strings<'py>(&self, py: Python<'py>, items: &[(Span, Span)]) -> PyResult<Bound<'py, PyDict>> {
        let b = self.raw.as_bytes(py);
        let d = PyDict::new_bound(py);
        let s = |sp: &Span| std::str::from_utf8(&b[sp.0 as usize..sp.1 as usize]).unwrap_or("");
        for (k, v) in items {
            d.set_item(s(k), s(v))?;
        }
        Ok(d)
    }
}

#[pymethods]
impl RankStep {
    /// "step": the step reads as a step event wherever one is read (the recorder, the
    /// fleet view); the fields below are made on each read, as read_event gives them
    #[getter]
    fn kind(&self) -> &'static str {
        "step"
    }

    #[getter]
    fn metrics<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let b = self.raw.as_bytes(py);
        let d = PyDict::new_bound(py);
        for (k, v) in &self.metrics {
            let name = std::str::from_utf8(&b[k.0 as usize..k.1 as usize]).unwrap_or("");
            d.set_item(name, PyFloat::new_bound(py, *v))?;
        }
        Ok(d)
    }

    #[getter]
    fn tags<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        self.strings(py, &self.tag_items)
    }

    #[getter]
    fn hashes<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        self.hashes_dict(py)
    }

    #[getter]
    fn batch_ids<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let b = self.raw.as_bytes(py);
        let ids = self
            .batch_ids
            .iter()
            .map(|s| std::str::from_utf8(&b[s.0 as usize..s.1 as usize]).unwrap_or(""));
        Ok(PyList::new_bound(py, ids))
    }

    /// (a rank's step read here has none)
    #[getter]
    fn dists<'py>(&self, py: Python<'py>) -> Bound<'py, PyDict> {
        PyDict::new_bound(py)
    }

    #[getter]
    fn groups<'py>(&self, py: Python<'py>) -> Bound<'py, PyDict> {
        PyDict::new_bound(py)
    }
}

/// A plainly valid step of a rank other than 0 with nothing unusual, read from its JSON bytes;
/// None for anything else, an object other than `bytes` included (`contract.events.read_event`
/// then decides, and words any reason).
#[pyfunction]
pub fn read_rank_step(py: Python<'_>, raw: &Bound<'_, PyAny>) -> PyResult<Option<RankStep>> {
    let Ok(raw) = raw.downcast_exact::<PyBytes>() else {
        return Ok(None);
    };
    let b = raw.as_bytes();
    let p = match parse(b) {
        Some(p) => p,
        None => return Ok(None),
    };
    let s = |sp: Span| std::str::from_utf8(&b[sp.0 as usize..sp.1 as usize]).unwrap_or("");
    let run_id = PyString::new_bound(py, s(p.run_id)).unbind();
    let incarnation = p.incarnation.map(|i| PyString::new_bound(py, s(i)).unbind());
    let tags_json = PyBytes::new_bound(py, &b[p.tags.0 as usize..p.tags.1 as usize]).unbind();
    Ok(Some(RankStep::of(raw, p, run_id, incarnation, tags_json)))
}
