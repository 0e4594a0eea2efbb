//! `tokengate`: the operator's command for the tokengate filter. It uses the filter crate's own
//! configuration parser, key layout, estimator and money formatting, and talks to Redis (or a Redis
//! Cluster) directly:
//!
//! ```text
//! tokengate check envoy/envoy.yaml                      the filter's validation, without Envoy (exit 1 if refused)
//! tokengate explain cfg.json --tenant alice --model gpt-4.1 --body req.json
//! tokengate --config cfg.json usage --group team=red --by model --format csv
//! tokengate --config cfg.json override set --tenant alice --limit 100000
//! tokengate --config cfg.json month give-back alice
//! tokengate --config cfg.json leases
//! ```
//!
//! Every failure is one line on stderr and an exit code ([`fail`]); nothing panics.

#![deny(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    clippy::unreachable,
    clippy::todo,
    clippy::unimplemented
)]
#![cfg_attr(
    test,
    allow(
        clippy::unwrap_used,
        clippy::expect_used,
        clippy::panic,
        clippy::indexing_slicing
    )
)]

mod accounts;
mod explain;
mod fail;
mod ops;
mod source;
mod store;
mod usage;

use clap::{Args, Parser, Subcommand};
use fail::Failure;
use std::io::Write;
use std::process::ExitCode;

const EXAMPLES: &str = "\
Examples:
  tokengate check envoy/envoy.yaml                  # the filter's own validation, no Envoy needed (CI: exit 1 if refused)
  tokengate check envoy/istio/wasmplugin.yaml config.json
  tokengate explain envoy/envoy.yaml --tenant alice --model gpt-4.1 --body request.json
  export TOKENGATE_CONFIG=envoy/envoy.yaml TOKENGATE_REDIS=redis://127.0.0.1:6380
  tokengate usage                                   # this month, every account
  tokengate usage --group team=red --by model --format csv
  tokengate usage --tenant alice --month 2026-11 --format json
  tokengate override set --tenant alice --limit 100000000
  tokengate override set --budget team-spend --group team=red --limit 750.50
  tokengate override list
  tokengate month give-back alice
  tokengate leases

Exit codes: 0 done; 1 invalid configuration; 2 bad command line or input file; 3 Redis unreachable or
failing; 4 Redis holds keys of another key schema version; 5 the configuration does not match Redis.";

/// The tokengate admin command: check configurations, explain a request, report usage and spend from
/// Redis, set limit overrides, give a month back, list leases.
#[derive(Parser)]
#[command(name = "tokengate", version, after_help = EXAMPLES)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    #[command(flatten)]
    global: Global,
}

#[derive(Args, Clone)]
struct Global {
    /// The filter configuration: its JSON, an Envoy bootstrap or Istio manifests (YAML or JSON).
    #[arg(long, global = true, env = "TOKENGATE_CONFIG", value_name = "FILE")]
    config: Option<String>,
    /// Which filter of a file that holds several: its name or its number (as `check` lists them).
    #[arg(long, global = true, value_name = "NAME|N")]
    plugin: Option<String>,
    /// Redis (or one node of a Redis Cluster): redis://[user:password@]host:port[/db].
    #[arg(
        long,
        global = true,
        env = "TOKENGATE_REDIS",
        default_value = "redis://127.0.0.1:6379",
        value_name = "URL"
    )]
    redis: String,
}

#[derive(Subcommand)]
enum Command {
    /// Validate configurations as the filter does at load, with its one-line messages (no Envoy).
    #[command(
        after_help = "Examples:\n  tokengate check config.json\n  tokengate check envoy/envoy.yaml envoy/istio/wasmplugin.yaml\n\n\
        Prints one line per filter configuration found: `<where>: ok: configured: …` or\n\
        `<where>: invalid configuration: <the line the filter logs>`. In an Envoy bootstrap whose\n\
        clusters are all static, a `quota.cluster` or `global_buckets.cluster` it does not define is\n\
        refused too (every call to it would fail). Exit 1 if any is refused, 2 if a\n\
        file cannot be read or holds no filter configuration."
    )]
    Check {
        /// JSON files of the plugin configuration, Envoy bootstraps, Istio manifests (or use --config).
        #[arg(value_name = "CONFIG")]
        files: Vec<String>,
    },
    /// Which rules, limits, budgets, breaker and quota keys a request would meet, and its estimated cost.
    #[command(
        after_help = "Example:\n  tokengate explain envoy/envoy.yaml --tenant alice --group team=red --body request.json\n\n\
        The estimate is the filter's own (the same code); no Redis or Envoy is asked."
    )]
    Explain {
        /// The configuration (or use --config).
        #[arg(value_name = "CONFIG")]
        file: Option<String>,
        /// The request's tenant.
        #[arg(long)]
        tenant: String,
        /// A group: level=value (repeat for nested levels), or a bare value with `group_header`.
        #[arg(long = "group", value_name = "LEVEL=VALUE")]
        groups: Vec<String>,
        /// The model (the `model_header`'s value; used when the body names none).
        #[arg(long)]
        model: Option<String>,
        /// The request body (JSON); `-` reads stdin.
        #[arg(long, value_name = "FILE")]
        body: String,
        /// The request path: which API the body is read as.
        #[arg(long, default_value = "/v1/chat/completions")]
        path: String,
        /// The upstream cluster the route picks (for the breaker's cluster key).
        #[arg(long)]
        cluster: Option<String>,
        /// The month of the quota keys (YYYY-MM; default: this month at quota.month_offset_minutes).
        #[arg(long)]
        month: Option<String>,
    },
    /// Chargeback report from Redis: usage and spend per tenant, budget, team or model, with totals.
    #[command(
        after_help = "Examples:\n  tokengate usage --month 2026-11\n  tokengate usage --group team=red --by model\n  \
        tokengate usage --tenant alice --format json\n  tokengate usage --by budget --format csv > spend.csv\n\n\
        Columns: used (the counter), in_leases (held by Envoys' leases, not spent yet), in_flight (reserved by\n\
        requests not settled yet), settled = used - in_leases - in_flight, limit (override or configured),\n\
        remaining = limit - used. Token quotas count weighted tokens (quota.weights); money budgets\n\
        micro-units, printed as exact decimals of quota.currency. tokens_in / tokens_out: the provider's\n\
        input and output tokens of the requests settled (leased ones once their lease reported them; `-`\n\
        where none were recorded). Redis keeps no per-model amounts for budgets: `--by model` shows `*` for an\n\
        account without model counters."
    )]
    Usage {
        /// The month (YYYY-MM; default: this month at quota.month_offset_minutes).
        #[arg(long)]
        month: Option<String>,
        /// Only this tenant: its token quota, its own budgets, its fixed groups' budgets.
        #[arg(long, conflicts_with = "group")]
        tenant: Option<String>,
        /// Only budgets of this group: team=red, org=acme/team=red, or red.
        #[arg(long)]
        group: Option<String>,
        /// Only this budget.
        #[arg(long)]
        budget: Option<String>,
        /// Rows per account, per account and model, or per budget.
        #[arg(long, value_enum, default_value_t = usage::By::Account)]
        by: usage::By,
        /// Output format.
        #[arg(long, value_enum, default_value_t = usage::Format::Table)]
        format: usage::Format,
    },
    /// Limit overrides in Redis (a tenant's monthly or per-model limit, a budget's limit), no redeploy.
    #[command(subcommand)]
    Override(OverrideCmd),
    /// Month operations.
    #[command(subcommand)]
    Month(MonthCmd),
    /// The quota leases Envoys hold: how much of which account, since when.
    #[command(after_help = "Example:\n  tokengate leases --tenant alice\n\n\
        SINCE is read from the lease's version (milliseconds when it was granted, plus one per sync);\n\
        LAST SYNC needs the configuration (quota.lease.ttl_s). A lease is counted in its account's counter\n\
        from the moment it is granted; its unspent part goes back when its Envoy is idle (idle_s).")]
    Leases {
        /// Only this tenant's accounts (and its tenant-scope budgets).
        #[arg(long)]
        tenant: Option<String>,
    },
}

#[derive(Args, Clone)]
struct TargetArgs {
    /// The tenant (its token quota; with --budget, the subject of a per-tenant budget).
    #[arg(long)]
    tenant: Option<String>,
    /// A budget (quota.budgets[].name) instead of a tenant's token quota.
    #[arg(long)]
    budget: Option<String>,
    /// The budget's group: level=value (repeat for nested levels), or a bare value with `group_header`.
    #[arg(long = "group", value_name = "LEVEL=VALUE")]
    groups: Vec<String>,
}

impl TargetArgs {
    fn target(&self) -> ops::Target {
        ops::Target {
            tenant: self.tenant.clone(),
            budget: self.budget.clone(),
            groups: self.groups.clone(),
        }
    }
}

#[derive(Subcommand)]
enum OverrideCmd {
    /// Set a limit (tokens, or an amount of the budget's currency); applies every month until cleared.
    #[command(
        after_help = "Examples:\n  tokengate override set --tenant alice --limit 100000000\n  \
        tokengate override set --tenant alice --model gpt-4.1 --limit 2000000\n  \
        tokengate override set --budget team-spend --group team=red --limit 750.50\n\n\
        Token buckets (rules, limits) have no runtime override: change the configuration."
    )]
    Set {
        #[command(flatten)]
        target: TargetArgs,
        /// A tenant's per-model limit instead of its monthly limit.
        #[arg(long)]
        model: Option<String>,
        /// The new limit: whole weighted tokens, or the budget's currency (at most 6 decimals).
        #[arg(long)]
        limit: String,
    },
    /// Remove an override: the configured limit applies again.
    Clear {
        #[command(flatten)]
        target: TargetArgs,
        /// A tenant's per-model limit.
        #[arg(long)]
        model: Option<String>,
    },
    /// Every override in Redis, beside the configured limit (with --config).
    List,
}

#[derive(Subcommand)]
enum MonthCmd {
    /// Give an account its month back: its counters drop to what leases and requests in flight hold.
    #[command(after_help = "Examples:\n  tokengate month give-back alice\n  \
        tokengate month give-back --budget team-spend --group team=red\n\n\
        Usage settled so far this month is forgotten; what Envoys' leases hold and requests in flight\n\
        reserved stays counted, so their settlements still add up. Raising the limit (override set) is the\n\
        alternative that keeps the record.")]
    GiveBack {
        /// The tenant.
        #[arg(value_name = "TENANT")]
        tenant: Option<String>,
        /// A budget instead of the tenant's token quota.
        #[arg(long)]
        budget: Option<String>,
        /// The budget's group: level=value.
        #[arg(long = "group", value_name = "LEVEL=VALUE")]
        groups: Vec<String>,
        /// The month (YYYY-MM; default: this month).
        #[arg(long)]
        month: Option<String>,
    },
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            let _ = e.print();
            return ExitCode::from(if e.use_stderr() { 2 } else { 0 });
        }
    };
    match run(cli) {
        Ok(code) => ExitCode::from(code),
        Err(f) => {
            let mut err = std::io::stderr().lock();
            let _ = writeln!(err, "tokengate: {}", f.message);
            ExitCode::from(f.code)
        }
    }
}

/// Writes to stdout; a closed pipe (`| head`) ends quietly.
fn out(s: &str) {
    let mut o = std::io::stdout().lock();
    let _ = o.write_all(s.as_bytes());
}

fn config(g: &Global) -> Result<tokengate::config::Config, Failure> {
    let file = g.config.as_deref().ok_or_else(|| {
        Failure::input(
            "this command needs the filter configuration: --config FILE (or TOKENGATE_CONFIG)",
        )
    })?;
    source::load(file, g.plugin.as_deref()).map(|(_, c)| c)
}

fn optional_config(g: &Global) -> Result<Option<tokengate::config::Config>, Failure> {
    match g.config {
        None => Ok(None),
        Some(_) => config(g).map(Some),
    }
}

fn now_unix() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_secs()).unwrap_or(0))
        .unwrap_or(0)
}

/// `--month`, checked, or this month at the configured offset.
fn month(cfg: &tokengate::config::Config, arg: Option<&str>) -> Result<String, Failure> {
    match arg {
        Some(m) => {
            let ok = m.len() == 7
                && m.get(4..5) == Some("-")
                && m.get(..4)
                    .is_some_and(|y| y.bytes().all(|b| b.is_ascii_digit()))
                && m.get(5..)
                    .and_then(|x| x.parse::<u32>().ok())
                    .is_some_and(|x| (1..=12).contains(&x));
            if ok {
                Ok(m.to_string())
            } else {
                Err(Failure::input(format!("--month {m:?}: write YYYY-MM")))
            }
        }
        None => {
            let off = cfg.quota.as_ref().map_or(0, |q| q.month_offset_minutes);
            Ok(tokengate::quota::calendar::month_label(now_unix(), off))
        }
    }
}

fn table(rows: &[Vec<String>]) -> String {
    let ncol = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..ncol)
        .map(|i| {
            rows.iter()
                .map(|r| r.get(i).map_or(0, |c| c.chars().count()))
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut s = String::new();
    for r in rows {
        let cols: Vec<String> = r
            .iter()
            .enumerate()
            .map(|(i, c)| format!("{c:<w$}", w = widths.get(i).copied().unwrap_or(0)))
            .collect();
        s.push_str(cols.join("  ").trim_end());
        s.push('\n');
    }
    s
}

/// A shim cluster the configuration calls that its Envoy bootstrap does not define (`clusters`: the
/// bootstrap's, when they are all in the file): every call to it fails, so every request meets
/// `on_failure` (503 `quota_unavailable` by default).
fn missing_cluster(cfg: &tokengate::config::Config, clusters: Option<&[String]>) -> Option<String> {
    let clusters = clusters?;
    let calls = [
        (
            "quota.cluster",
            cfg.quota.as_ref().map(|q| q.cluster.as_str()),
        ),
        (
            "global_buckets.cluster",
            cfg.global.as_ref().map(|g| g.cluster.as_str()),
        ),
    ];
    calls.into_iter().find_map(|(field, name)| {
        let name = name?;
        (!clusters.iter().any(|c| c == name)).then(|| {
            format!(
                "{field} names cluster '{name}', which this file's static_resources.clusters does not \
                 define ({}): every call to it would fail",
                clusters.join(", ")
            )
        })
    })
}

fn check(files: &[String]) -> u8 {
    let mut code = 0u8;
    for file in files {
        let found = std::fs::read(file)
            .map_err(|e| Failure::input(format!("{file}: {e}")))
            .and_then(|text| source::find(file, &text));
        let found = match found {
            Ok(f) if f.is_empty() => Err(Failure::input(format!(
                "{file}: no tokengate filter configuration found (an envoy.filters.http.wasm filter with a \
                 StringValue configuration, or an Istio WasmPlugin)"
            ))),
            other => other,
        };
        match found {
            Err(f) => {
                let mut err = std::io::stderr().lock();
                let _ = writeln!(err, "tokengate: {}", f.message);
                code = 2;
            }
            Ok(list) => {
                for f in list {
                    match tokengate::config::parse(&f.bytes) {
                        Ok(cfg) => match missing_cluster(&cfg, f.clusters.as_deref()) {
                            None => out(&format!(
                                "{}: ok: configured: {}\n",
                                f.locator,
                                cfg.summary()
                            )),
                            Some(why) => {
                                out(&format!("{}: invalid configuration: {why}\n", f.locator));
                                if code == 0 {
                                    code = 1;
                                }
                            }
                        },
                        Err(e) => {
                            out(&format!("{}: invalid configuration: {e}\n", f.locator));
                            if code == 0 {
                                code = 1;
                            }
                        }
                    }
                }
            }
        }
    }
    code
}

fn run(cli: Cli) -> Result<u8, Failure> {
    let g = cli.global;
    match cli.command {
        Command::Check { mut files } => {
            if files.is_empty() {
                files.extend(g.config.clone());
            }
            if files.is_empty() {
                return Err(Failure::input(
                    "name a configuration to check: tokengate check CONFIG... (or --config FILE)",
                ));
            }
            Ok(check(&files))
        }
        Command::Explain {
            file,
            tenant,
            groups,
            model,
            body,
            path,
            cluster,
            month: m,
        } => {
            let file = file.or_else(|| g.config.clone()).ok_or_else(|| {
                Failure::input("explain needs the configuration: CONFIG or --config FILE")
            })?;
            let (_, cfg) = source::load(&file, g.plugin.as_deref())?;
            let bytes = if body == "-" {
                let mut b = Vec::new();
                std::io::Read::read_to_end(&mut std::io::stdin(), &mut b)
                    .map_err(|e| Failure::input(format!("stdin: {e}")))?;
                b
            } else {
                std::fs::read(&body).map_err(|e| Failure::input(format!("{body}: {e}")))?
            };
            let month = month(&cfg, m.as_deref())?;
            out(&explain::explain(
                &cfg,
                &explain::Request {
                    tenant: &tenant,
                    groups: &groups,
                    model: model.as_deref(),
                    path: &path,
                    body: &bytes,
                    cluster: cluster.as_deref(),
                    month: &month,
                },
            )?);
            Ok(0)
        }
        Command::Usage {
            month: m,
            tenant,
            group,
            budget,
            by,
            format,
        } => {
            let cfg = config(&g)?;
            let month = month(&cfg, m.as_deref())?;
            if let Some(gr) = &group {
                for part in gr.split('/') {
                    if let Some((level, _)) = part.split_once('=') {
                        if !cfg.groups.iter().any(|l| l.name == level) {
                            let names: Vec<&str> =
                                cfg.groups.iter().map(|l| l.name.as_str()).collect();
                            return Err(Failure::input(format!(
                                "--group {gr:?}: no group level {level:?} in the configuration (levels: {names:?})"
                            )));
                        }
                    }
                }
            }
            let mut store = store::Store::connect(&g.redis)?;
            let months = accounts::read_month(&mut store, &month)?;
            let sel = usage::Select {
                tenant,
                group,
                budget,
            };
            let rows = usage::rows(&cfg, &months, &sel, by)?;
            out(&usage::render(&month, &rows, by, format));
            Ok(0)
        }
        Command::Override(o) => {
            let mut store = store::Store::connect(&g.redis)?;
            match o {
                OverrideCmd::Set {
                    target,
                    model,
                    limit,
                } => {
                    let cfg = config(&g)?;
                    let line = ops::override_set(
                        &mut store,
                        &cfg,
                        &target.target(),
                        model.as_deref(),
                        &limit,
                    )?;
                    out(&format!("{line}\n"));
                }
                OverrideCmd::Clear { target, model } => {
                    let cfg = config(&g)?;
                    let line =
                        ops::override_clear(&mut store, &cfg, &target.target(), model.as_deref())?;
                    out(&format!("{line}\n"));
                }
                OverrideCmd::List => {
                    let cfg = optional_config(&g)?;
                    let rows = ops::override_list(&mut store, cfg.as_ref())?;
                    out(&table(&rows));
                }
            }
            Ok(0)
        }
        Command::Month(MonthCmd::GiveBack {
            tenant,
            budget,
            groups,
            month: m,
        }) => {
            let cfg = config(&g)?;
            let month = month(&cfg, m.as_deref())?;
            let mut store = store::Store::connect(&g.redis)?;
            let t = ops::Target {
                tenant,
                budget,
                groups,
            };
            for line in ops::give_back(&mut store, &cfg, &t, &month)? {
                out(&format!("{line}\n"));
            }
            Ok(0)
        }
        Command::Leases { tenant } => {
            let cfg = optional_config(&g)?;
            let mut store = store::Store::connect(&g.redis)?;
            let rows = ops::leases(&mut store, cfg.as_ref(), tenant.as_deref())?;
            if rows.len() <= 1 {
                out("no quota leases in Redis\n");
            } else {
                out(&table(&rows));
            }
            Ok(0)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shim_cluster_the_bootstrap_does_not_define_is_named() {
        let cfg = tokengate::config::parse(
            br#"{"tenant_header": "x-tenant-id", "trusted_headers": {"set_by": "the test"},
                "rules": [{"tokens_per_second": 1, "burst": 1}],
                "quota": {"cluster": "webdis", "monthly_limit": 1000}}"#,
        )
        .unwrap();
        let defined = ["provider".to_string(), "webdis".to_string()];
        assert_eq!(missing_cluster(&cfg, Some(&defined)), None);
        assert_eq!(
            missing_cluster(&cfg, None),
            None,
            "clusters not all in the file"
        );
        let why = missing_cluster(&cfg, Some(&defined[..1])).unwrap();
        assert!(
            why.starts_with("quota.cluster names cluster 'webdis'"),
            "{why}"
        );
    }

    #[test]
    fn every_shipped_envoy_example_passes_check() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../envoy");
        let mut n = 0;
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            let name = p.to_string_lossy().to_string();
            let envoy = p
                .file_name()
                .is_some_and(|f| f.to_string_lossy().starts_with("envoy"));
            if envoy && name.ends_with(".yaml") {
                assert_eq!(check(std::slice::from_ref(&name)), 0, "{name}");
                n += 1;
            }
        }
        assert!(n >= 1);
    }
}
