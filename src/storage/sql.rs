//! A statement under construction: SQL text plus typed binds, with placeholders written in the
//! connected backend's dialect (`$1` for PostgreSQL, `?` for SQLite).

use std::fmt::Write as _;

use chrono::NaiveDateTime;
use diesel::QueryResult;
use diesel::query_builder::{BoxedSqlQuery, SqlQuery};
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
}

impl Sql {
    /// Starts a statement for `backend`.
    pub fn new(backend: Backend, text: &str) -> Self {
        Self {
            backend,
            text: text.to_owned(),
            binds: Vec::new(),
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
        match self.backend {
            Backend::Postgres => {
                let _ = write!(self.text, "${}", self.binds.len());
            }
            Backend::Sqlite => self.text.push('?'),
        }
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

    /// The SQL text (for tests and debugging).
    pub fn text(&self) -> &str {
        &self.text
    }

    /// How many values are bound.
    pub fn bind_count(&self) -> usize {
        self.binds.len()
    }

    fn build(self) -> BoxedSqlQuery<'static, MultiBackend, SqlQuery> {
        let mut q = diesel::sql_query(self.text).into_boxed::<MultiBackend>();
        for b in self.binds {
            q = match b {
                Bind::Text(v) => q.bind::<Text, _>(v),
                Bind::OptText(v) => q.bind::<Nullable<Text>, _>(v),
                Bind::BigInt(v) => q.bind::<BigInt, _>(v),
                Bind::Int(v) => q.bind::<Integer, _>(v),
                Bind::Double(v) => q.bind::<Double, _>(v),
                Bind::Bool(v) => q.bind::<Bool, _>(v),
                Bind::Time(v) => q.bind::<Timestamp, _>(v),
                Bind::OptTime(v) => q.bind::<Nullable<Timestamp>, _>(v),
                Bind::OptBigInt(v) => q.bind::<Nullable<BigInt>, _>(v),
            };
        }
        q
    }

    /// Runs the statement and decodes every row.
    pub fn load<T>(self, conn: &mut AnyConnection) -> QueryResult<Vec<T>>
    where
        T: diesel::deserialize::QueryableByName<MultiBackend> + 'static,
    {
        self.build().load(conn)
    }

    /// Runs the statement and hands each decoded row to `each`, without collecting them (for
    /// results of a million rows).
    pub fn for_each<T>(self, conn: &mut AnyConnection, mut each: impl FnMut(T)) -> QueryResult<()>
    where
        T: diesel::deserialize::QueryableByName<MultiBackend> + 'static,
    {
        for row in self
            .build()
            .load_iter::<T, diesel::connection::DefaultLoadingMode>(conn)?
        {
            each(row?);
        }
        Ok(())
    }

    /// Runs the statement; returns the number of rows it touched.
    pub fn execute(self, conn: &mut AnyConnection) -> QueryResult<usize> {
        self.build().execute(conn)
    }
}

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
