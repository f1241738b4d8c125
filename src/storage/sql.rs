//! A statement under construction: SQL text plus typed binds, with placeholders written in the
//! connected backend's dialect (`$1` for PostgreSQL, `?` for SQLite).

use std::fmt::Write as _;

use chrono::NaiveDateTime;
use diesel::QueryResult;
use diesel::query_dsl::RunQueryDsl;
use diesel::sql_types::{BigInt, Bool, Double, Integer, Nullable, Text, Timestamp};

use super::{AnyConnection, Backend, MultiBackend};

/// One bound value.
#[derive(Debug, Clone, PartialEq)]
pub enum Bind {
    /// TEXT
    Text(String),
    /// TEXT NULL
    OptText(Option<String>),
    /// BIGINT
    BigInt(i64),
    /// BIGINT NULL
    OptBigInt(Option<i64>),
    /// INTEGER
    Int(i32),
    /// DOUBLE PRECISION
    Double(f64),
    /// BOOLEAN
    Bool(bool),
    /// TIMESTAMP (UTC, naive)
    Time(NaiveDateTime),
    /// TIMESTAMP NULL
    OptTime(Option<NaiveDateTime>),
}

impl From<&str> for Bind {
    fn from(s: &str) -> Self {
        Self::Text(s.to_owned())
    }
}

impl From<String> for Bind {
    fn from(s: String) -> Self {
        Self::Text(s)
    }
}

impl From<i64> for Bind {
    fn from(v: i64) -> Self {
        Self::BigInt(v)
    }
}

impl From<NaiveDateTime> for Bind {
    fn from(v: NaiveDateTime) -> Self {
        Self::Time(v)
    }
}

/// SQL text and its binds.
#[derive(Debug, Clone)]
pub struct Sql {
    backend: Backend,
    text: String,
    binds: Vec<Bind>,
    /// Where each bind's placeholder sits in `text` (start, end), replaced by the bind when run.
    spans: Vec<(usize, usize)>,
}

impl Sql {
    /// Starts a statement for `backend`.
    pub fn new(backend: Backend, text: &str) -> Self {
        Self {
            backend,
            text: text.to_owned(),
            binds: Vec::new(),
            spans: Vec::new(),
        }
    }

    /// The dialect being written.
    pub fn backend(&self) -> Backend {
        self.backend
    }

    /// Appends SQL text.
    pub fn push(&mut self, text: &str) -> &mut Self {
        self.text.push_str(text);
        self
    }

    /// Appends a placeholder bound to `value`.
    pub fn bind(&mut self, value: impl Into<Bind>) -> &mut Self {
        self.binds.push(value.into());
        let start = self.text.len();
        match self.backend {
            Backend::Postgres => {
                let _ = write!(self.text, "${}", self.binds.len());
            }
            Backend::Sqlite => self.text.push('?'),
        }
        self.spans.push((start, self.text.len()));
        self
    }

    /// Appends `(p1, p2, …)` bound to `values`; `(NULL)` when empty, which matches nothing.
    pub fn bind_list<B: Into<Bind>>(&mut self, values: impl IntoIterator<Item = B>) -> &mut Self {
        self.text.push('(');
        let mut first = true;
        for v in values {
            if !first {
                self.text.push_str(", ");
            }
            first = false;
            self.bind(v);
        }
        if first {
            self.text.push_str("NULL");
        }
        self.text.push(')');
        self
    }

    /// The statement's plan instead of its rows: `EXPLAIN` before its text, its binds kept, so a
    /// test can read the plan a statement gets on a given table (on PostgreSQL one row of text
    /// per line of the plan, in a column named `QUERY PLAN`).
    pub fn explained(mut self) -> Self {
        const PREFIX: &str = "EXPLAIN ";
        self.text.insert_str(0, PREFIX);
        for span in &mut self.spans {
            *span = (span.0 + PREFIX.len(), span.1 + PREFIX.len());
        }
        self
    }

    /// The SQL text (for tests and debugging).
    pub fn text(&self) -> &str {
        &self.text
    }

    /// How many values are bound.
    pub fn bind_count(&self) -> usize {
        self.binds.len()
    }

    /// Runs the statement as a prepared statement the connection keeps (keyed by its text), and
    /// decodes every row: PostgreSQL parses and plans it once per connection instead of on every
    /// run. Only for statements whose text does not depend on their values (a fixed number of
    /// binds, values such as id lists passed as one JSON bind), or the cache would grow with
    /// every new text.
    pub fn load_prepared<T>(self, conn: &mut AnyConnection) -> QueryResult<Vec<T>>
    where
        T: diesel::deserialize::QueryableByName<MultiBackend> + 'static,
    {
        self.statement(true).load(conn)
    }

    /// Runs the statement as a kept prepared statement (see [`Sql::load_prepared`]); returns the
    /// number of rows it touched.
    pub fn execute_prepared(self, conn: &mut AnyConnection) -> QueryResult<usize> {
        self.statement(true).execute(conn)
    }

    /// Runs the statement and decodes every row.
    pub fn load<T>(self, conn: &mut AnyConnection) -> QueryResult<Vec<T>>
    where
        T: diesel::deserialize::QueryableByName<MultiBackend> + 'static,
    {
        self.statement(false).load(conn)
    }

    /// Runs the statement and hands each decoded row to `each`, without collecting them (for
    /// results of a million rows).
    pub fn for_each<T>(self, conn: &mut AnyConnection, mut each: impl FnMut(T)) -> QueryResult<()>
    where
        T: diesel::deserialize::QueryableByName<MultiBackend> + 'static,
    {
        for row in self
            .statement(false)
            .load_iter::<T, diesel::connection::DefaultLoadingMode>(conn)?
        {
            each(row?);
        }
        Ok(())
    }

    /// Runs the statement; returns the number of rows it touched.
    pub fn execute(self, conn: &mut AnyConnection) -> QueryResult<usize> {
        self.statement(false).execute(conn)
    }

    fn statement(self, keep: bool) -> Statement {
        Statement { sql: self, keep }
    }
}

/// What diesel runs: the text with each placeholder handed over as a typed bind. `keep`: the
/// connection may keep it prepared (its callers promise a fixed text, [`Sql::load_prepared`]);
/// otherwise it is marked unsafe to cache, as diesel's own raw-SQL queries mark themselves,
/// since their text changes with the number of values.
struct Statement {
    sql: Sql,
    keep: bool,
}

impl diesel::query_builder::QueryFragment<MultiBackend> for Statement {
    fn walk_ast<'b>(
        &'b self,
        mut out: diesel::query_builder::AstPass<'_, 'b, MultiBackend>,
    ) -> QueryResult<()> {
        if !self.keep {
            out.unsafe_to_cache_prepared();
        }
        let Sql {
            text, binds, spans, ..
        } = &self.sql;
        let mut at = 0;
        for (bind, (start, end)) in binds.iter().zip(spans) {
            out.push_sql(&text[at..*start]);
            match bind {
                Bind::Text(v) => out.push_bind_param::<Text, _>(v)?,
                Bind::OptText(v) => out.push_bind_param::<Nullable<Text>, _>(v)?,
                Bind::BigInt(v) => out.push_bind_param::<BigInt, _>(v)?,
                Bind::OptBigInt(v) => out.push_bind_param::<Nullable<BigInt>, _>(v)?,
                Bind::Int(v) => out.push_bind_param::<Integer, _>(v)?,
                Bind::Double(v) => out.push_bind_param::<Double, _>(v)?,
                Bind::Bool(v) => out.push_bind_param::<Bool, _>(v)?,
                Bind::Time(v) => out.push_bind_param::<Timestamp, _>(v)?,
                Bind::OptTime(v) => out.push_bind_param::<Nullable<Timestamp>, _>(v)?,
            }
            at = *end;
        }
        out.push_sql(&text[at..]);
        Ok(())
    }
}

impl diesel::query_builder::QueryId for Statement {
    type QueryId = ();
    const HAS_STATIC_QUERY_ID: bool = false;
}

impl diesel::query_builder::Query for Statement {
    type SqlType = diesel::sql_types::Untyped;
}

impl<Conn> RunQueryDsl<Conn> for Statement {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placeholders_follow_the_backend() {
        let mut pg = Sql::new(Backend::Postgres, "SELECT 1 WHERE a = ");
        pg.bind("x").push(" AND b IN ").bind_list([1i64, 2]);
        assert_eq!(pg.text(), "SELECT 1 WHERE a = $1 AND b IN ($2, $3)");
        let mut lite = Sql::new(Backend::Sqlite, "SELECT 1 WHERE a = ");
        lite.bind("x")
            .push(" AND b IN ")
            .bind_list(Vec::<i64>::new());
        assert_eq!(lite.text(), "SELECT 1 WHERE a = ? AND b IN (NULL)");
        assert_eq!(lite.bind_count(), 1);
    }
}
