//! A routine step of a rank other than 0, taken natively: what `RunState.rank_step` does
//! (streams/run.py) for the commonest event of a fleet. The checks that the step is routine,
//! against the run's state, and the bookkeeping taking it makes; anything else is left to
//! `RunState.apply`, the reference, which takes every event and words every rejection. A rank
//! reads its own rules (checks for non-finite values, in the built-in pack) at a step with a
//! non-finite value and at each step while an alert is open on it: such steps are routine too,
//! and the caller evaluates those rules.
//!
//! * `Routine.take(state, step, now)` takes one step that `read_rank_step` read: ``(the steps
//!   of the cross-rank buffer now complete (most often none), whether the rank's own rules
//!   are due)``, or None when the step is not routine, with nothing changed.
//! * `Routine.take_run(state, records, order, pos, now, keep, taken, limit)` takes the run's
//!   next records of a batch one after another (the worker's events lane, which takes a batch
//!   a run at a time): it reads the run's state once, takes records while each is a routine
//!   step of this run, and writes the state back once. It stops before the first record that
//!   is not (another run's, rank 0's, anything `take` would refuse), after a step that
//!   completes a step of the cross-rank buffer or whose rank's rules are due (the caller
//!   evaluates those rules), and after `limit` records. Given the native scan of the
//!   cross-rank rules, it reads them itself at a step they complete, and goes on when none
//!   holds and none has an alert state (evaluating them would change nothing).
//!
//! The checks, in `rank_step`'s order: a timestamp within the limits (`now` when it has none),
//! a rank under the limit, the run's incarnation, the run's tags (compared as bytes with the
//! last tags known to read as them), a step not too far ahead, no preset to rename by or to
//! look for, a step after the rank's last one, and a compiled rank program that lets its
//! steps skip its rules when their values are finite.

use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyByteArray, PyBytes, PyDict, PyList, PySet, PyString, PyTuple};

use crate::logic::Scan;
use crate::ranks::RankBuffer;
use crate::wire::{parse, RankStep, Span};

/// The limits of streams/run.py the checks apply.
#[pyclass(module = "streams._native", frozen)]
pub struct Routine {
    max_ts_age: f64,
    max_ts_ahead: f64,
    max_ranks: i64,
    max_step_jump: i64,
    preset_tries: i64,
}

/// What the checks read of a run's state (read once a call) and what taking steps changes of
/// it (written back once, by `write`).
struct Run<'py> {
    st: Bound<'py, PyAny>,
    incarnation: Bound<'py, PyAny>,
    /// tags known to read as the run's tags (`_tags_raw`, while its tags are those)
    tags: Option<Bound<'py, PyBytes>>,
    newest: i64,
    renamed: bool,
    preset_tries: i64,
    last_step: Bound<'py, PyDict>,
    last_seen: Bound<'py, PyDict>,
    programs: Bound<'py, PyDict>,
    ranks_open: Bound<'py, PySet>,
    cross_rank: bool,
    world_size: i64,
    ranks: Option<Bound<'py, RankBuffer>>,
    now: f64,
    events: i64,
    last_event_ts: f64,
    took: bool,
}

impl<'py> Run<'py> {
    /// The run's state as the checks read it; None when no step of it can be routine (it
    /// looks for news on every event, its buffer is not the native one, or a field is not of
    /// the type the run writes: RunState.apply then takes the step as it takes any other).
    fn read(st: &Bound<'py, PyAny>) -> PyResult<Option<Run<'py>>> {
        Ok(Run::fields(st).unwrap_or(None))
    }

    fn fields(st: &Bound<'py, PyAny>) -> PyResult<Option<Run<'py>>> {
        let py = st.py();
        if st.getattr(intern!(py, "news_on_every_event"))?.is_truthy()? {
            return Ok(None);
        }
        let cross_rank = st.getattr(intern!(py, "cross_rank"))?.is_truthy()?;
        let ranks = st.getattr(intern!(py, "ranks"))?.downcast_into::<RankBuffer>().ok();
        if cross_rank && ranks.is_none() {
            return Ok(None);
        }
        Ok(Some(Run {
            incarnation: st.getattr(intern!(py, "incarnation"))?,
            tags: known_tags(st)?,
            newest: st.getattr(intern!(py, "newest"))?.extract()?,
            renamed: !st.getattr(intern!(py, "_renamer"))?.is_none(),
            preset_tries: st.getattr(intern!(py, "_preset_tries"))?.extract()?,
            last_step: st.getattr(intern!(py, "last_step"))?.downcast_into()?,
            last_seen: st.getattr(intern!(py, "last_seen"))?.downcast_into()?,
            programs: st.getattr(intern!(py, "programs"))?.downcast_into()?,
            ranks_open: st.getattr(intern!(py, "_ranks_open"))?.downcast_into()?,
            cross_rank,
            world_size: st.getattr(intern!(py, "world_size"))?.extract()?,
            ranks,
            now: st.getattr(intern!(py, "now"))?.extract()?,
            events: st.getattr(intern!(py, "events"))?.extract()?,
            last_event_ts: st.getattr(intern!(py, "last_event_ts"))?.extract()?,
            took: false,
            st: st.clone(),
        }))
    }

    /// Write back what taking steps changed (when it took one).
    fn write(&self) -> PyResult<()> {
        if !self.took {
            return Ok(());
        }
        let (st, py) = (&self.st, self.st.py());
        st.setattr(intern!(py, "now"), self.now)?;
        st.setattr(intern!(py, "events"), self.events)?;
        st.setattr(intern!(py, "closed"), false)?;
        st.setattr(intern!(py, "last_event_ts"), self.last_event_ts)?;
        st.setattr(intern!(py, "newest"), self.newest)?;
        st.setattr(intern!(py, "world_size"), self.world_size)
    }
}

/// The bytes of the last tags known to read as the run's tags: `_tags_raw[0]` while
/// `_tags_raw[1]` is still the run's `_tags_seen`.
fn known_tags<'py>(st: &Bound<'py, PyAny>) -> PyResult<Option<Bound<'py, PyBytes>>> {
    let py = st.py();
    let raw = st.getattr(intern!(py, "_tags_raw"))?;
    if raw.is_none() {
        return Ok(None);
    }
    let t = raw.downcast::<PyTuple>()?;
    if !t.get_item(1)?.is(&st.getattr(intern!(py, "_tags_seen"))?) {
        return Ok(None);
    }
    Ok(t.get_item(0)?.downcast_into::<PyBytes>().ok())
}

/// A step's fields as the checks read them.
struct Fields<'a> {
    ts: Option<f64>,
    rank: i64,
    step: i64,
    world: Option<i64>,
    incarnation: Option<&'a [u8]>,
    tags: &'a [u8],
    has_metrics: bool,
    finite: bool,
}

/// Text items (spans of `b`) as a dict of str -> str, as `read_event` reads them.
fn dict_of<'py>(py: Python<'py>, b: &[u8], items: &[(Span, Span)]) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new_bound(py);
    let s = |sp: &Span| std::str::from_utf8(&b[sp.0 as usize..sp.1 as usize]).unwrap_or("");
    for (k, v) in items {
        d.set_item(s(k), s(v))?;
    }
    Ok(d)
}

impl Routine {
    /// The time of step `f` when it is routine for `run` (`now` when it has none), and whether
    /// its rank's own rules are due (an alert is open on the rank: they are read at each of its
    /// steps); None when it is not routine. Only the tags may change (`_tags_raw`, as
    /// rank_step notes them).
    fn check<'py>(
        &self,
        run: &mut Run<'py>,
        f: &Fields<'_>,
        tags_dict: impl FnOnce() -> PyResult<Bound<'py, PyDict>>,
        now: f64,
    ) -> PyResult<Option<(f64, bool)>> {
        let py = run.st.py();
        let ts = match f.ts {
            None => now,
            Some(ts) if now - self.max_ts_age <= ts && ts <= now + self.max_ts_ahead => ts,
            Some(_) => return Ok(None),
        };
        if f.rank >= self.max_ranks {
            return Ok(None);
        }
        if let Some(inc) = f.incarnation {
            match run.incarnation.downcast::<PyString>() {
                Ok(have) if have.to_str()?.as_bytes() == inc => {}
                _ => return Ok(None),
            }
        }
        if !f.tags.is_empty() && !run.tags.as_ref().is_some_and(|k| k.as_bytes() == f.tags) {
            let tags = tags_dict()?;
            let seen = run.st.getattr(intern!(py, "_tags_seen"))?;
            if tags.contains(intern!(py, "generation"))? || !tags.eq(&seen)? {
                return Ok(None);
            }
            let raw = PyBytes::new_bound(py, f.tags);
            run.st.setattr(intern!(py, "_tags_raw"), (raw.clone(), seen))?;
            run.tags = Some(raw);
        }
        if run.newest >= 0 && f.step - run.newest > self.max_step_jump {
            return Ok(None);
        }
        if run.renamed || (run.preset_tries < self.preset_tries && f.has_metrics) {
            return Ok(None);
        }
        if let Some(last) = run.last_step.get_item(f.rank)? {
            if f.step <= last.extract::<i64>()? {
                return Ok(None);
            }
        }
        let Some(program) = run.programs.get_item(f.rank)? else {
            return Ok(None);
        };
        if !program.getattr(intern!(py, "routine"))?.is_truthy()? {
            return Ok(None);
        }
        // (a routine program with rules for every step skips them when its values are finite
        // and no alert is open on the rank: RunState._rank_step)
        let due = program.getattr(intern!(py, "every_step"))?.is_truthy()?
            && (!f.finite || run.ranks_open.contains(f.rank)?);
        Ok(Some((ts, due)))
    }

    /// Take routine step `f` at `ts` into `run` (`ev`: the step, for the cross-rank buffer);
    /// the buffer's steps now complete.
    fn apply<'py>(
        &self,
        run: &mut Run<'py>,
        f: &Fields<'_>,
        ts: f64,
        ev: Option<&Bound<'py, RankStep>>,
    ) -> PyResult<Vec<i64>> {
        run.took = true;
        run.now = ts;
        run.events += 1;
        run.last_seen.set_item(f.rank, ts)?;
        if !(ts <= run.last_event_ts) {
            run.last_event_ts = ts;
        }
        run.last_step.set_item(f.rank, f.step)?;
        if f.step > run.newest {
            run.newest = f.step;
        }
        if run.cross_rank && f.world.unwrap_or(run.world_size) > 1 {
            if let Some(w) = f.world {
                if w > run.world_size {
                    run.world_size = w.min(self.max_ranks);
                }
            }
            if run.world_size > 1 {
                if let (Some(ranks), Some(ev)) = (&run.ranks, ev) {
                    return ranks.get().take_read(run.st.py(), ev, run.world_size);
                }
            }
        }
        Ok(Vec::new())
    }
}

#[pymethods]
impl Routine {
    #[new]
    fn new(max_ts_age: f64, max_ts_ahead: f64, max_ranks: i64, max_step_jump: i64, preset_tries: i64) -> Routine {
        Routine { max_ts_age, max_ts_ahead, max_ranks, max_step_jump, preset_tries }
    }

    /// Take `event` (a step `read_rank_step` read) into run state `st` at wall time `now`:
    /// ``(the cross-rank buffer's steps now complete, whether its rank's own rules are due)``,
    /// or None when the step is not routine.
    fn take(&self, st: &Bound<'_, PyAny>, event: &Bound<'_, RankStep>, now: f64) -> PyResult<Option<(Vec<i64>, bool)>> {
        let py = st.py();
        let Some(mut run) = Run::read(st)? else {
            return Ok(None);
        };
        let ev = event.get();
        let inc = ev.incarnation.as_ref().map(|i| i.bind(py));
        let inc = match &inc {
            Some(i) => Some(i.to_str()?.as_bytes()),
            None => None,
        };
        let f = Fields {
            ts: ev.ts,
            rank: ev.rank,
            step: ev.step,
            world: ev.world_size,
            incarnation: inc,
            tags: ev.tags_json.bind(py).as_bytes(),
            has_metrics: ev.has_metrics,
            finite: ev.finite,
        };
        let Some((ts, due)) = self.check(&mut run, &f, || ev.tags_dict(py), now)? else {
            return Ok(None);
        };
        let done = self.apply(&mut run, &f, ts, Some(event));
        run.write()?;
        Ok(Some((done?, due)))
    }

    /// Take the records of `records` (Kafka records: their ``value`` is an event's bytes) at
    /// ``order[pos:]`` into run state `st` while each is a routine step of the run, at most
    /// `limit`; each one taken is kept by `keep` (the snapshot recorder's keeper: the row
    /// ``(step, rank, raw, keep.unread)`` given to ``keep.append``, which is what calling
    /// ``keep(step, rank, raw)`` does, without a Python frame per step) and marked in `taken`
    /// (``taken[i] = 1``). ``(the position after the last one taken,
    /// how many were taken, the cross-rank buffer's steps the last one completed, the last one
    /// when its rank's own rules are due, else None)``: it stops after a step that completes
    /// a step of the buffer or whose rules are due.
    #[allow(clippy::too_many_arguments)]
    #[pyo3(signature = (st, records, order, pos, now, keep, taken, limit, ranks_scan))]
    fn take_run(
        &self,
        st: &Bound<'_, PyAny>,
        records: &Bound<'_, PyList>,
        order: &Bound<'_, PyAny>,
        pos: usize,
        now: f64,
        keep: &Bound<'_, PyAny>,
        taken: &Bound<'_, PyByteArray>,
        limit: usize,
        ranks_scan: Option<&Bound<'_, Scan>>,
    ) -> PyResult<(usize, usize, Vec<i64>, Option<Py<RankStep>>)> {
        let py = st.py();
        let Some(mut run) = Run::read(st)? else {
            return Ok((pos, 0, Vec::new(), None));
        };
        let run_id = st.getattr(intern!(py, "run_id"))?.downcast_into::<PyString>()?;
        let mut pos = pos;
        let mut count = 0;
        let got = self.take_records(&mut run, &run_id, records, order, &mut pos, &mut count, now, keep, taken, limit,
                                    ranks_scan);
        run.write()?;
        let (done, due) = got?;
        Ok((pos, count, done, due.map(Bound::unbind)))
    }
}

impl Routine {
    /// The steps of `done` (complete in the cross-rank buffer) from the first whose cross-rank
    /// rules (`scan`, their native scan) may change something: the steps before it have no
    /// test that holds and no alert state, so evaluating them (as `RunState._ranks_in` does:
    /// open the step, scan, close it) changes nothing but taking the step out of the buffer,
    /// which is done here. That first step is put back as it was, for the caller's
    /// `_ranks_in` (so is one whose scan fails: it fails there again, where a failure is
    /// handled).
    fn quiet_steps<'py>(&self, run: &Run<'py>, scan: &Bound<'py, Scan>, done: Vec<i64>) -> PyResult<Vec<i64>> {
        let py = run.st.py();
        let Some(ranks) = &run.ranks else {
            return Ok(done);
        };
        let (ranks, scan) = (ranks.get(), scan.get());
        let alerts = run.st.getattr(intern!(py, "alerts"))?.downcast_into::<PyDict>()?;
        for (i, &step) in done.iter().enumerate() {
            let at = ranks.open_at(py, step)?;
            match scan.hits(py, &alerts, 1) {
                Ok(hits) if hits.is_empty() => ranks.shut(py)?,
                _ => {
                    ranks.put_back(step, at)?;
                    return Ok(done[i..].to_vec());
                }
            }
        }
        Ok(Vec::new())
    }

    /// The loop of `take_run` (its state written back by the caller, whatever happens here).
    #[allow(clippy::too_many_arguments)]
    fn take_records<'py>(
        &self,
        run: &mut Run<'py>,
        run_id: &Bound<'py, PyString>,
        records: &Bound<'py, PyList>,
        order: &Bound<'py, PyAny>,
        pos: &mut usize,
        count: &mut usize,
        now: f64,
        keep: &Bound<'py, PyAny>,
        taken: &Bound<'py, PyByteArray>,
        limit: usize,
        ranks_scan: Option<&Bound<'py, Scan>>,
    ) -> PyResult<(Vec<i64>, Option<Bound<'py, RankStep>>)> {
        let py = run.st.py();
        let id = run_id.to_str()?.as_bytes();
        let listed = order.downcast::<PyList>().ok();
        let n = order.len()?;
        let value = intern!(py, "value");
        let no_tags = PyBytes::new_bound(py, b"");
        let append = keep.getattr(intern!(py, "append"))?;
        let unread = keep.getattr(intern!(py, "unread"))?;
        while *pos < n && *count < limit {
            let i: usize = match listed {
                Some(l) => l.get_item(*pos)?.extract()?,
                None => order.get_item(*pos)?.extract()?,
            };
            if i >= taken.len() {
                break;
            }
            let raw = records.get_item(i)?.getattr(value)?;
            let Ok(raw) = raw.downcast_exact::<PyBytes>() else {
                break;
            };
            let b = raw.as_bytes();
            let Some(p) = parse(b) else {
                break;
            };
            if &b[p.run_id.0 as usize..p.run_id.1 as usize] != id {
                break;
            }
            let f = Fields {
                ts: p.ts,
                rank: p.rank,
                step: p.step,
                world: p.world_size,
                incarnation: p.incarnation.map(|s| &b[s.0 as usize..s.1 as usize]),
                tags: &b[p.tags.0 as usize..p.tags.1 as usize],
                has_metrics: !p.metrics.is_empty(),
                finite: p.finite(),
            };
            let Some((ts, due)) = self.check(run, &f, || dict_of(py, b, &p.tag_items), now)? else {
                break;
            };
            let (rank, step) = (f.rank, f.step);
            let ev = if run.cross_rank || due {
                // (the step's incarnation and tags are the run's, checked above)
                let incarnation = match f.incarnation {
                    Some(_) => Some(run.incarnation.downcast::<PyString>()?.clone().unbind()),
                    None => None,
                };
                let tags = match (&run.tags, f.tags.is_empty()) {
                    (Some(t), false) => t.clone().unbind(),
                    _ => no_tags.clone().unbind(),
                };
                Some(Bound::new(py, RankStep::of(raw, p, run_id.clone().unbind(), incarnation, tags))?)
            } else {
                None
            };
            let done = self.apply(run, &f, ts, ev.as_ref())?;
            append.call1(((step, rank, raw, &unread),))?;
            // SAFETY: nothing else runs meanwhile (the GIL is held); `i` is in range (above)
            unsafe { taken.as_bytes_mut()[i] = 1 };
            *pos += 1;
            *count += 1;
            if due {
                return Ok((done, ev));
            }
            if !done.is_empty() {
                let left = match ranks_scan {
                    Some(scan) => self.quiet_steps(run, scan, done)?,
                    None => done,
                };
                if !left.is_empty() {
                    return Ok((left, None));
                }
            }
        }
        Ok((Vec::new(), None))
    }
}
