//! What an import did, per table: counted as it runs (the progress lines read it) and printed at
//! the end. The printed form is for operators; tests read its `key value` counts.

use std::collections::BTreeMap;
use std::fmt;

use super::rules::Refusal;

/// Ids listed per refusal rule in the summary; every refused row is logged with its id and
/// reason as it is met, so a long tail is in the log, not lost.
pub const IDS_LISTED: usize = 20;

/// One refusal rule's rows.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Refused {
    /// Rows refused under the rule.
    pub count: u64,
    /// The first [`IDS_LISTED`] of them, with what was wrong.
    pub examples: Vec<(String, String)>,
}

/// The counts of one table.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TableSummary {
    /// Rows read from mula.
    pub read: u64,
    /// Rows written (in a dry run: that would be written).
    pub imported: u64,
    /// Rows whose id kat-scheduler's database holds already: left as they are.
    pub present: u64,
    /// Schedules whose hash another schedule holds already (`(mula id, holder id)`): skipped,
    /// since hashes are unique; their tasks are linked to the holder.
    pub hash_taken: Vec<(String, String)>,
    /// Refused rows by rule.
    pub refused: BTreeMap<&'static str, Refused>,
    /// Imported rows whose hash was missing or not the payload's in mula: stored with the
    /// payload's hash (kat-scheduler's de-duplication key).
    pub rehashed: u64,
    /// Imported tasks whose schedule is neither imported nor in the database: stored without
    /// the link.
    pub unlinked: u64,
    /// Tasks mula held dispatched or running past their lease, written failed.
    pub stalled: u64,
    /// Rows of a scheduler per organisation (mula before OpenKAT 1.19), written under their
    /// type's scheduler.
    pub legacy: u64,
    /// Imported rows by the status they were written with (tasks).
    pub by_status: BTreeMap<&'static str, u64>,
}

impl TableSummary {
    /// Records a refused row.
    pub fn refuse(&mut self, r: &Refusal) {
        let entry = self.refused.entry(r.rule).or_default();
        entry.count += 1;
        if entry.examples.len() < IDS_LISTED {
            entry.examples.push((r.id.clone(), r.detail.clone()));
        }
    }

    /// Rows refused, all rules.
    pub fn refused_total(&self) -> u64 {
        self.refused.values().map(|r| r.count).sum()
    }

    fn write(&self, f: &mut fmt::Formatter<'_>, table: &str) -> fmt::Result {
        write!(
            f,
            "{table}: read {}, imported {}, already present {}",
            self.read, self.imported, self.present
        )?;
        if table == "schedules" {
            write!(f, ", hash taken {}", self.hash_taken.len())?;
        }
        writeln!(f, ", refused {}", self.refused_total())?;
        if !self.by_status.is_empty() {
            let parts: Vec<String> = self
                .by_status
                .iter()
                .map(|(s, n)| format!("{s} {n}"))
                .collect();
            writeln!(f, "  {table} imported by status: {}", parts.join(", "))?;
        }
        if self.rehashed > 0 {
            writeln!(
                f,
                "  {table} stored with the payload's hash (mula's was missing or differed): {}",
                self.rehashed
            )?;
        }
        if self.legacy > 0 {
            writeln!(
                f,
                "  {table} of mula's schedulers per organisation (before OpenKAT 1.19), under their type's: {}{}",
                self.legacy,
                if table == "tasks" {
                    " (those waiting or handed out cancelled)"
                } else {
                    ""
                }
            )?;
        }
        if self.stalled > 0 {
            writeln!(
                f,
                "  {table} failed as stalled (dispatched or running in mula for longer than their lease): {}",
                self.stalled
            )?;
        }
        if self.unlinked > 0 {
            writeln!(
                f,
                "  {table} stored without their schedule (not in mula's import nor here): {}",
                self.unlinked
            )?;
        }
        for (id, holder) in &self.hash_taken {
            writeln!(
                f,
                "  schedule {id} skipped: its hash is held by schedule {holder} already"
            )?;
        }
        for (rule, r) in &self.refused {
            writeln!(f, "  {table} refused ({rule}): {}", r.count)?;
            for (id, detail) in &r.examples {
                writeln!(f, "    {id}: {detail}")?;
            }
            if r.count > r.examples.len() as u64 {
                writeln!(
                    f,
                    "    … and {} more (each is in the log)",
                    r.count - r.examples.len() as u64
                )?;
            }
        }
        Ok(())
    }
}

/// The whole import.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Summary {
    /// Nothing was written.
    pub dry_run: bool,
    /// mula's `schedules`.
    pub schedules: TableSummary,
    /// mula's `tasks`.
    pub tasks: TableSummary,
}

impl Summary {
    /// Whether the run added nothing because everything was there already.
    pub fn nothing_new(&self) -> bool {
        self.schedules.imported == 0 && self.tasks.imported == 0
    }
}

impl fmt::Display for Summary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.dry_run {
            writeln!(
                f,
                "import-mula summary (dry run: nothing was written; \"imported\" is what an import would write)"
            )?;
        } else {
            writeln!(f, "import-mula summary")?;
        }
        self.schedules.write(f, "schedules")?;
        self.tasks.write(f, "tasks")?;
        if self.nothing_new() {
            let here = self.schedules.present
                + self.tasks.present
                + self.schedules.hash_taken.len() as u64;
            let refused = self.schedules.refused_total() + self.tasks.refused_total();
            let line = match (here > 0, refused > 0) {
                (true, false) => {
                    "nothing new: every row of mula's that can be imported is here already"
                }
                (true, true) => {
                    "nothing new: the rows of mula's that can be imported are here already, and the rest were refused (above)"
                }
                (false, true) => "nothing imported: every row of mula's was refused (above)",
                (false, false) => "nothing new: mula's database holds nothing to import",
            };
            writeln!(f, "{line}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::import::rules::Refusal;

    fn last_line(s: &Summary) -> String {
        s.to_string().lines().last().unwrap_or_default().to_owned()
    }

    #[test]
    fn a_run_that_imports_nothing_says_whether_rows_were_refused_or_there_already() {
        let mut s = Summary::default();
        assert!(last_line(&s).contains("holds nothing to import"));
        s.tasks.read = 1;
        s.tasks.refuse(&Refusal {
            id: "t1".into(),
            rule: "scheduler",
            detail: "scheduler_id 'scanner'".into(),
        });
        assert_eq!(
            last_line(&s),
            "nothing imported: every row of mula's was refused (above)"
        );
        s.schedules.read = 1;
        s.schedules.present = 1;
        assert!(last_line(&s).contains("the rest were refused"), "{s}");
        s.tasks.refused.clear();
        assert!(last_line(&s).contains("is here already"), "{s}");
    }
}
