//! Calendar months in UTC or a fixed offset, for monthly quotas: which month an instant belongs to, its
//! label in key names and when it ends. Pure: time comes in as unix seconds.
//!
//! A month is the calendar month in UTC or in a fixed offset (minutes east of UTC, ±14 h):
//! [`month_of`], [`month_label`] (`"2026-11"`), [`month_end_unix`] (first instant of the next month) and
//! [`seconds_to_reset`]. Inputs are clamped (`now` to 1970..=9999, the offset to ±14 h), so nothing here
//! can overflow or panic. Day arithmetic is Howard Hinnant's `civil_from_days` / `days_from_civil`.
//!
//! ```
//! # use tokengate::quota::calendar::*;
//! let last_second_of_november = 1_796_083_199; // 2026-11-30T23:59:59Z
//! assert_eq!(month_label(last_second_of_november, 0), "2026-11");
//! assert_eq!(month_end_unix(last_second_of_november, 0), last_second_of_november + 1);
//! assert_eq!(month_label(last_second_of_november, 60), "2026-12"); // already December at +01:00
//! ```

/// Largest accepted `now`: 9999-12-31T23:59:59Z. Inputs are clamped to `[0, MAX_UNIX_S]` so the
/// arithmetic below can never overflow.
pub const MAX_UNIX_S: i64 = 253_402_300_799;
/// Largest accepted offset magnitude in minutes (±14 h, the widest real-world offset).
pub const MAX_OFFSET_MIN: i32 = 14 * 60;

fn local_seconds(now_unix_s: i64, offset_min: i32) -> i64 {
    let off = i64::from(offset_min.clamp(-MAX_OFFSET_MIN, MAX_OFFSET_MIN)) * 60;
    now_unix_s.clamp(0, MAX_UNIX_S) + off
}

/// Days since 1970-01-01 → (year, month 1..=12, day 1..=31). Howard Hinnant's `civil_from_days`.
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = if m <= 2 { y + 1 } else { y };
    (y, m as u32, d as u32)
}

/// (year, month 1..=12, day) → days since 1970-01-01. Howard Hinnant's `days_from_civil`.
fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let (m, d) = (i64::from(m), i64::from(d));
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let mp = if m > 2 { m - 3 } else { m + 9 };
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// The calendar month `(year, month 1..=12)` containing `now_unix_s` in the fixed offset `offset_min`
/// (minutes east of UTC, clamped to ±14 h; `now` clamped to 1970..=9999).
pub fn month_of(now_unix_s: i64, offset_min: i32) -> (i32, u32) {
    let (y, m, _) = civil_from_days(local_seconds(now_unix_s, offset_min).div_euclid(86_400));
    (i32::try_from(y).unwrap_or(i32::MAX), m)
}

/// The month as used in key names: `"2026-11"`.
pub fn month_label(now_unix_s: i64, offset_min: i32) -> String {
    let (y, m) = month_of(now_unix_s, offset_min);
    format!("{y:04}-{m:02}")
}

/// The first instant of the next month in that offset, as unix seconds (when the quota resets).
pub fn month_end_unix(now_unix_s: i64, offset_min: i32) -> i64 {
    let off = i64::from(offset_min.clamp(-MAX_OFFSET_MIN, MAX_OFFSET_MIN)) * 60;
    let (y, m) = month_of(now_unix_s, offset_min);
    let (ny, nm) = if m >= 12 {
        (i64::from(y) + 1, 1)
    } else {
        (i64::from(y), m + 1)
    };
    days_from_civil(ny, nm, 1) * 86_400 - off
}

/// The first instant after month `year`/`month` (1..=12) in that offset, as unix seconds.
pub fn end_of_month(year: i32, month: u32, offset_min: i32) -> i64 {
    let off = i64::from(offset_min.clamp(-MAX_OFFSET_MIN, MAX_OFFSET_MIN)) * 60;
    let (ny, nm) = if month >= 12 {
        (i64::from(year) + 1, 1)
    } else {
        (i64::from(year), month.max(1) + 1)
    };
    days_from_civil(ny, nm, 1) * 86_400 - off
}

/// Seconds from `now` until the quota resets (always ≥ 1).
pub fn seconds_to_reset(now_unix_s: i64, offset_min: i32) -> u64 {
    seconds_until(month_end_unix(now_unix_s, offset_min), now_unix_s)
}

/// Seconds from `now` until `reset_unix_s` (always ≥ 1: a reset that has passed is "now").
pub fn seconds_until(reset_unix_s: i64, now_unix_s: i64) -> u64 {
    let left = reset_unix_s.saturating_sub(now_unix_s.clamp(0, MAX_UNIX_S));
    u64::try_from(left).unwrap_or(0).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    // 2026-11-30T23:59:59Z
    const NOV_LAST_SECOND: i64 = 1_796_083_199;

    #[test]
    fn month_of_epoch_is_january_1970() {
        assert_eq!(month_of(0, 0), (1970, 1));
        assert_eq!(month_label(0, 0), "1970-01");
    }

    #[test]
    fn last_second_of_november_is_still_november_and_next_second_is_december() {
        assert_eq!(month_of(NOV_LAST_SECOND, 0), (2026, 11));
        assert_eq!(month_of(NOV_LAST_SECOND + 1, 0), (2026, 12));
        assert_eq!(month_end_unix(NOV_LAST_SECOND, 0), NOV_LAST_SECOND + 1);
        assert_eq!(seconds_to_reset(NOV_LAST_SECOND, 0), 1);
    }

    #[test]
    fn december_rolls_over_into_january_of_next_year() {
        let dec31 = 1_798_761_599; // 2026-12-31T23:59:59Z
        assert_eq!(month_label(dec31, 0), "2026-12");
        assert_eq!(month_end_unix(dec31, 0), 1_798_761_600); // 2027-01-01T00:00:00Z
        assert_eq!(month_label(dec31 + 1, 0), "2027-01");
        assert_eq!(month_end_unix(dec31 + 1, 0), 1_801_440_000); // 2027-02-01
    }

    #[test]
    fn leap_day_2028_belongs_to_february_which_ends_on_march_first() {
        let feb29 = 1_835_395_200; // 2028-02-29T00:00:00Z
        assert_eq!(month_of(feb29, 0), (2028, 2));
        assert_eq!(month_of(feb29 + 86_399, 0), (2028, 2));
        assert_eq!(month_end_unix(feb29, 0), feb29 + 86_400);
        assert_eq!(month_of(feb29 + 86_400, 0), (2028, 3));
        // 2100 is not a leap year: February 2100 has 28 days.
        let feb1_2100 = 4_105_123_200;
        assert_eq!(month_end_unix(feb1_2100, 0) - feb1_2100, 28 * 86_400);
    }

    #[test]
    fn positive_offset_of_14_hours_starts_the_month_earlier_in_utc() {
        // 2026-11-30T10:00:00Z is 2026-12-01T00:00 at +14:00.
        let t = 1_796_032_800;
        assert_eq!(month_of(t - 1, 840), (2026, 11));
        assert_eq!(month_of(t, 840), (2026, 12));
        assert_eq!(month_end_unix(t - 1, 840), t);
        assert_eq!(month_of(t, 0), (2026, 11));
    }

    #[test]
    fn negative_offset_of_14_hours_ends_the_month_later_in_utc() {
        // 2026-12-01T14:00:00Z is 2026-12-01T00:00 at -14:00.
        let t = 1_796_133_600;
        assert_eq!(month_of(t - 1, -840), (2026, 11));
        assert_eq!(month_of(t, -840), (2026, 12));
        assert_eq!(month_end_unix(NOV_LAST_SECOND, -840), t);
        assert_eq!(seconds_to_reset(NOV_LAST_SECOND, -840), 14 * 3600 + 1);
    }

    #[test]
    fn offsets_beyond_14_hours_and_absurd_times_are_clamped_without_panicking() {
        assert_eq!(
            month_of(NOV_LAST_SECOND, i32::MAX),
            month_of(NOV_LAST_SECOND, 840)
        );
        assert_eq!(month_of(i64::MIN, 0), (1970, 1));
        assert_eq!(month_of(i64::MIN, i32::MIN), (1969, 12));
        assert_eq!(month_of(i64::MAX, 0), (9999, 12));
        assert!(seconds_to_reset(i64::MAX, 0) >= 1);
        assert!(seconds_to_reset(i64::MIN, -840) >= 1);
    }

    #[test]
    fn civil_conversion_round_trips_every_day_over_four_centuries() {
        for days in (0..146_097 * 2).step_by(1) {
            let (y, m, d) = civil_from_days(days);
            assert_eq!(days_from_civil(y, m, d), days);
        }
    }

    #[test]
    fn month_end_is_after_now_and_in_the_next_month_for_many_instants() {
        let mut t = 0i64;
        while t < 4_200_000_000 {
            for off in [-840, -330, 0, 345, 840] {
                let end = month_end_unix(t, off);
                assert!(end > t, "t={t} off={off}");
                assert_ne!(month_of(end, off), month_of(t, off));
                assert_eq!(month_of(end - 1, off), month_of(t, off));
            }
            t += 86_400 * 7 + 3_607;
        }
    }
}
