//! Event time: formatting, parsing, and the bounds of what is taken in.

use super::error::{bad, DecodeError};
use ::time::format_description::well_known::Rfc3339;
use ::time::OffsetDateTime;

/// Event time: milliseconds since the Unix epoch, UTC.
pub type Millis = i64;

/// RFC 3339 with milliseconds, UTC.
pub fn format_time(ms: Millis) -> String {
    let nanos = i128::from(ms) * 1_000_000;
    match OffsetDateTime::from_unix_timestamp_nanos(nanos) {
        // Four-digit years by hand: a format description is interpreted on every call, and an
        // alert formats several times (its own times, its evidence's).
        Ok(t) if (0..=9999).contains(&t.year()) => {
            let (h, mi, sec, milli) = t.to_hms_milli();
            let mut out = *b"0000-00-00T00:00:00.000Z";
            let mut put = |at: usize, width: usize, mut v: u32| {
                for i in (at..at + width).rev() {
                    out[i] = b'0' + (v % 10) as u8;
                    v /= 10;
                }
            };
            put(0, 4, t.year() as u32);
            put(5, 2, u32::from(u8::from(t.month())));
            put(8, 2, u32::from(t.day()));
            put(11, 2, u32::from(h));
            put(14, 2, u32::from(mi));
            put(17, 2, u32::from(sec));
            put(20, 3, u32::from(milli));
            String::from_utf8_lossy(&out).into_owned()
        }
        Ok(t) => {
            let fmt = ::time::macros::format_description!(
                "[year]-[month]-[day]T[hour]:[minute]:[second].[subsecond digits:3]Z"
            );
            t.format(&fmt).unwrap_or_else(|_| ms.to_string())
        }
        Err(_) => ms.to_string(),
    }
}

/// The wall clock, in epoch milliseconds.
pub fn now_ms() -> Millis {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64)
}

/// Parses RFC 3339 (`2026-01-01T00:00:00Z`) into epoch milliseconds.
pub fn parse_time(s: &str) -> Option<Millis> {
    let t = OffsetDateTime::parse(s.trim(), &Rfc3339).ok()?;
    i64::try_from(t.unix_timestamp_nanos() / 1_000_000).ok()
}

/// The earliest event time taken in: the Unix epoch (traces that count from their own start,
/// as Google's and Alibaba's do, begin there).
pub const MIN_TS: Millis = 0;
/// The latest event time taken in: the last millisecond of year 9999. Within these bounds no
/// sum of an event time and a duration a rule can write (ten years at most) overflows.
pub const MAX_TS: Millis = 253_402_300_799_999;

/// Which event times are taken in, beyond [`MIN_TS`]..=[`MAX_TS`]: not too far ahead of the
/// wall clock, nor of the watermark. An event outside them is refused with the reason, so that
/// one hostile or broken timestamp cannot move event time far ahead and make every later event
/// late.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TimeBounds {
    /// How far ahead of the wall clock `ts` may be.
    pub max_future_ms: Option<Millis>,
    /// How far ahead of the watermark `ts` may be.
    pub max_jump_ms: Option<Millis>,
}

impl TimeBounds {
    /// Whether `ts` is taken when the wall clock says `now` and event time is at `watermark`.
    /// Inlined where events are read: taken times, nearly all of them, cost a few comparisons.
    #[inline]
    pub fn check(&self, ts: Millis, now: Millis, watermark: Option<Millis>) -> Result<(), DecodeError> {
        let in_range = (MIN_TS..=MAX_TS).contains(&ts);
        let near_now = self.max_future_ms.is_none_or(|max| ts <= now.saturating_add(max));
        let near_time = match (self.max_jump_ms, watermark) {
            (Some(max), Some(w)) => ts <= w.saturating_add(max),
            _ => true,
        };
        if in_range && near_now && near_time {
            Ok(())
        } else {
            Err(self.refusal(ts, now, watermark))
        }
    }

    /// Why [`TimeBounds::check`] refuses `ts`: the first bound it is outside.
    #[cold]
    #[inline(never)]
    fn refusal(&self, ts: Millis, now: Millis, watermark: Option<Millis>) -> DecodeError {
        let refuse = |reason: String| bad(Some("ts".into()), reason);
        if !(MIN_TS..=MAX_TS).contains(&ts) {
            return refuse(format!("{} is outside 1970-01-01 to 9999-12-31", time_text(ts)));
        }
        if let Some(max) = self.max_future_ms.filter(|max| ts > now.saturating_add(*max)) {
            return refuse(format!(
                "{} is {} ahead of this machine's clock; at most {} is accepted",
                format_time(ts),
                vigil_lang::ast::human_duration(ts.abs_diff(now)),
                vigil_lang::ast::human_duration(max.unsigned_abs())
            ));
        }
        let (max, w) = (self.max_jump_ms.unwrap_or_default(), watermark.unwrap_or_default());
        refuse(format!(
            "{} is {} ahead of event time ({}); at most {} is accepted",
            format_time(ts),
            vigil_lang::ast::human_duration(ts.abs_diff(w)),
            format_time(w),
            vigil_lang::ast::human_duration(max.unsigned_abs())
        ))
    }
}

/// A time for a message: RFC 3339 when it has a four-digit year, else epoch milliseconds.
fn time_text(ts: Millis) -> String {
    if (MIN_TS..=MAX_TS).contains(&ts) {
        format_time(ts)
    } else {
        format!("{ts} (epoch milliseconds)")
    }
}
