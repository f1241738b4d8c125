//! The `kat-scheduler` binary: `serve` (the default), `migrate`, `openapi`, `import-mula`.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use clap::{Parser, Subcommand};
use kat_scheduler::clock::SystemClock;
use kat_scheduler::config::Settings;
use kat_scheduler::startup::{Application, open_database, sqlite_lock};
use kat_scheduler::{api, config, import, storage, telemetry};
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

/// What `--help` adds after the options: where settings and data are.
const AFTER_HELP: &str = "\
Settings: built-in defaults, then the --config file (every key in docs/config.example.toml),
then environment variables under mula's names (SCHEDULER_API_PORT, SCHEDULER_DB_URI,
QUEUE_URI, KATALOGUS_API, ...): the table in the README's \"Configuration\" section names
each variable and its setting. A SCHEDULER_* variable that is not a setting is named in a
warning at start.

Data: by default an SQLite database at ./data/scheduler.db, relative to the working directory
(created at the first start); SCHEDULER_DB_URI=postgresql://USER@HOST/DB for PostgreSQL.
Logs go to stderr.";

#[derive(Parser)]
#[command(
    name = "kat-scheduler",
    version,
    about = "Priority-queue job broker for OpenKAT-style scanning workers",
    after_help = AFTER_HELP
)]
struct Cli {
    /// A TOML config file (settings in the environment override it). Read by every command.
    #[arg(long, global = true, value_name = "PATH")]
    config: Option<PathBuf>,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand)]
enum Command {
    /// Serve the REST API (the default).
    Serve,
    /// Apply pending database migrations and exit.
    Migrate,
    /// Print the OpenAPI document and exit; it states the configured limits, as
    /// `/openapi.json` does.
    Openapi,
    /// Copy mula's schedules and tasks into this database (migrated first), then print a
    /// summary. Run it with kat-scheduler stopped; running it again adds nothing.
    ImportMula {
        /// mula's PostgreSQL database, e.g. postgresql://USER:PASSWORD@HOST/scheduler.
        #[arg(long, value_name = "URI")]
        from: String,
        /// Read and check everything, write nothing, print the same summary.
        #[arg(long)]
        dry_run: bool,
        /// Rows per batch: one page read from mula, one transaction written here.
        #[arg(long, value_name = "ROWS", default_value_t = import::DEFAULT_BATCH)]
        batch_size: usize,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let command = cli.command.unwrap_or(Command::Serve);
    let settings = match Settings::load(cli.config.as_deref()) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("kat-scheduler: {}", telemetry::one_line(&e.to_string()));
            return ExitCode::from(2);
        }
    };
    if let Command::Openapi = command {
        return match api::openapi_json_for(&settings.limits) {
            Ok(json) => match std::io::Write::write_all(&mut std::io::stdout(), json.as_bytes()) {
                // A reader that stops early (`… openapi | head`) is not an error.
                Ok(()) => ExitCode::SUCCESS,
                Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("cannot write the OpenAPI document: {e}");
                    ExitCode::FAILURE
                }
            },
            Err(e) => {
                eprintln!("cannot render the OpenAPI document: {e}");
                ExitCode::FAILURE
            }
        };
    }
    telemetry::init(&settings.logging);
    // Warned, not refused: a misspelt name is most likely, but a deployment may set variables
    // of a newer or older version (mula's own are listed in config::IGNORED_MULA_VARS).
    let names: Vec<String> = std::env::vars_os()
        .filter_map(|(k, _)| k.into_string().ok())
        .collect();
    for unknown in config::unknown_variables(names.iter().map(String::as_str)) {
        warn!("{unknown}");
    }
    if let Command::ImportMula {
        from,
        dry_run,
        batch_size,
    } = command
    {
        let opts = import::Options {
            from,
            dry_run,
            batch: batch_size,
        };
        return match import::run(&settings, &opts, &SystemClock) {
            Ok(summary) => {
                print!("{summary}");
                ExitCode::SUCCESS
            }
            Err(e) => {
                let e = telemetry::one_line(&format!("{e:#}"));
                error!("{e}");
                eprintln!("kat-scheduler: {e}");
                ExitCode::FAILURE
            }
        };
    }
    let result = actix_web::rt::System::new().block_on(async move {
        match command {
            Command::Migrate => migrate(settings).await,
            _ => serve(settings).await,
        }
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            let e = telemetry::one_line(&format!("{e:#}"));
            error!("{e}");
            eprintln!("kat-scheduler: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn migrate(mut settings: Settings) -> anyhow::Result<()> {
    settings.database.migrate = true;
    // A running service holds the SQLite file's lock: migrating under its engines would hold
    // the database's one write lock through every statement, and their batches would fail.
    let _lock = sqlite_lock(&settings).await.map_err(|e| {
        anyhow::anyhow!(
            "{e:#}; stop kat-scheduler before migrating (serve migrates at start unless SCHEDULER_DB_MIGRATE=false)"
        )
    })?;
    let (pool, target) = open_database(&settings).await?;
    let mut conn = storage::checkout(&pool)?;
    let pending = storage::pending_migrations(&mut conn)?;
    info!(database = %target.display(), pending = pending.len(), "schema is up to date");
    Ok(())
}

async fn serve(settings: Settings) -> anyhow::Result<()> {
    // Handlers go in before the port opens: a SIGTERM that arrives the moment the service
    // listens must still stop it gracefully, not kill it.
    let signals = Signals::install()?;
    let app = Application::build(settings, Arc::new(SystemClock)).await?;
    let shutdown = CancellationToken::new();
    let trigger = shutdown.clone();
    actix_web::rt::spawn(async move {
        signals.wait().await;
        trigger.cancel();
    });
    app.run_until_stopped(shutdown).await
}

/// SIGINT and SIGTERM, registered at creation.
struct Signals {
    int: tokio::signal::unix::Signal,
    term: tokio::signal::unix::Signal,
}

impl Signals {
    fn install() -> anyhow::Result<Self> {
        use tokio::signal::unix::{SignalKind, signal};
        Ok(Self {
            int: signal(SignalKind::interrupt())?,
            term: signal(SignalKind::terminate())?,
        })
    }

    /// Resolves on the first SIGINT or SIGTERM.
    async fn wait(mut self) {
        tokio::select! {
            _ = self.int.recv() => info!("SIGINT received"),
            _ = self.term.recv() => info!("SIGTERM received"),
        }
    }
}
