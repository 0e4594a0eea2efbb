//! Redis, directly (not through Webdis): one server, or a Redis Cluster found from one of its nodes.
//!
//! `--redis redis://[user:password@]host:port[/db]` names a node; `INFO cluster` tells whether it is part
//! of a cluster, and then every command goes through the `redis` crate's cluster client (routed by slot:
//! one tenant's keys share the `{tenant}` hash tag, so one account's keys are on one node), and SCAN runs
//! on every master (from `CLUSTER NODES`). Every call has a timeout; every failure becomes a one-line
//! [`Failure`] naming the address.
//!
//! The key schema version: `tg:schema` holds the version of the key layout (`3`, the one the quota
//! scripts' protocol `tg3` writes). When it holds another, every command stops (exit 4) rather than read
//! keys it does not understand. The filter does not write it yet; the CLI checks it when it is there and
//! the records it reads in any case (a lease or reservation record of another shape is a schema error).

use crate::fail::Failure;
use redis::{Cmd, ConnectionLike, FromRedisValue, Value};
use std::time::Duration;

/// The key holding the key schema version.
pub const SCHEMA_KEY: &str = "tg:schema";

/// Commands per pipeline round trip.
const BATCH: usize = 512;
/// Connect and response timeouts.
const TIMEOUT: Duration = Duration::from_secs(5);

/// The key schema version this CLI reads and writes: the digits of the quota scripts' protocol tag.
pub fn schema_version() -> &'static str {
    tokengate::quota::QUOTA_PROTOCOL_TAG.trim_start_matches(|c: char| !c.is_ascii_digit())
}

enum Conn {
    Single(redis::Connection),
    Cluster {
        con: Box<redis::cluster::ClusterConnection>,
        masters: Vec<String>,
    },
}

/// A connection to Redis or a Redis Cluster.
pub struct Store {
    conn: Conn,
    url: String,
}

fn redis_err(url: &str, what: &str, e: &redis::RedisError) -> Failure {
    let mut msg = format!("Redis at {url}: {what}: {e}");
    if e.is_connection_refusal() || e.is_timeout() || e.is_io_error() {
        msg = format!(
            "cannot reach Redis at {url}: {e} (is it running? set --redis or TOKENGATE_REDIS)"
        );
    }
    Failure::redis(msg)
}

fn connect_single(url: &str) -> Result<redis::Connection, Failure> {
    let client =
        redis::Client::open(url).map_err(|e| Failure::input(format!("--redis {url}: {e}")))?;
    let con = client
        .get_connection_with_timeout(TIMEOUT)
        .map_err(|e| redis_err(url, "connect", &e))?;
    con.set_read_timeout(Some(TIMEOUT))
        .and_then(|()| con.set_write_timeout(Some(TIMEOUT)))
        .map_err(|e| redis_err(url, "connect", &e))?;
    Ok(con)
}

impl Store {
    /// Connects to `url` (a cluster when that node says so) and checks the key schema marker.
    pub fn connect(url: &str) -> Result<Store, Failure> {
        let mut first = connect_single(url)?;
        let info: String = redis::cmd("INFO")
            .arg("cluster")
            .query(&mut first)
            .map_err(|e| redis_err(url, "INFO cluster", &e))?;
        let conn = if info.contains("cluster_enabled:1") {
            let nodes: String = redis::cmd("CLUSTER")
                .arg("NODES")
                .query(&mut first)
                .map_err(|e| redis_err(url, "CLUSTER NODES", &e))?;
            let masters = cluster_masters(url, &nodes);
            let client = redis::cluster::ClusterClientBuilder::new(vec![url])
                .connection_timeout(TIMEOUT)
                .response_timeout(TIMEOUT)
                .retries(2)
                .build()
                .map_err(|e| redis_err(url, "cluster client", &e))?;
            let con = client
                .get_connection()
                .map_err(|e| redis_err(url, "connect to the cluster", &e))?;
            Conn::Cluster {
                con: Box::new(con),
                masters,
            }
        } else {
            Conn::Single(first)
        };
        let mut s = Store {
            conn,
            url: url.to_string(),
        };
        s.check_schema()?;
        Ok(s)
    }

    fn con(&mut self) -> &mut dyn ConnectionLike {
        match &mut self.conn {
            Conn::Single(c) => c,
            Conn::Cluster { con, .. } => con.as_mut(),
        }
    }

    fn check_schema(&mut self) -> Result<(), Failure> {
        let v: Option<String> = self.query(redis::cmd("GET").arg(SCHEMA_KEY))?;
        match v {
            Some(v) if v.trim() != schema_version() => Err(Failure::schema(format!(
                "Redis at {} holds key schema version {v:?} ({SCHEMA_KEY}); this tokengate reads version {}: \
                 use the tokengate CLI built with the filter that wrote these keys",
                self.url,
                schema_version()
            ))),
            _ => Ok(()),
        }
    }

    /// One command.
    pub fn query<T: FromRedisValue>(&mut self, cmd: &Cmd) -> Result<T, Failure> {
        let url = self.url.clone();
        cmd.query(self.con())
            .map_err(|e| redis_err(&url, &command_name(cmd), &e))
    }

    /// Many commands, pipelined (not atomic), answers in order.
    pub fn batch(&mut self, cmds: &[Cmd]) -> Result<Vec<Value>, Failure> {
        let url = self.url.clone();
        let mut out = Vec::with_capacity(cmds.len());
        for chunk in cmds.chunks(BATCH) {
            let values: Vec<Value> = match &mut self.conn {
                Conn::Single(c) => {
                    let mut p = redis::pipe();
                    for cmd in chunk {
                        p.add_command(cmd.clone());
                    }
                    p.query(c)
                }
                Conn::Cluster { con, .. } => {
                    let mut p = redis::cluster::cluster_pipe();
                    for cmd in chunk {
                        p.add_command(cmd.clone());
                    }
                    p.query(con.as_mut())
                }
            }
            .map_err(|e| redis_err(&url, "pipeline", &e))?;
            out.extend(values);
        }
        Ok(out)
    }

    /// Every key matching `pattern` (SCAN on the server, or on every master of a cluster), sorted.
    pub fn scan(&mut self, pattern: &str) -> Result<Vec<String>, Failure> {
        let mut keys = Vec::new();
        match &mut self.conn {
            Conn::Single(c) => scan_on(c, &self.url, pattern, &mut keys)?,
            Conn::Cluster { masters, .. } => {
                for m in masters.clone() {
                    let mut c = connect_single(&m)?;
                    scan_on(&mut c, &m, pattern, &mut keys)?;
                }
            }
        }
        keys.sort();
        keys.dedup();
        Ok(keys)
    }
}

fn command_name(cmd: &Cmd) -> String {
    cmd.args_iter()
        .next()
        .and_then(|a| match a {
            redis::Arg::Simple(b) => Some(String::from_utf8_lossy(b).to_string()),
            _ => None,
        })
        .unwrap_or_else(|| "command".to_string())
}

fn scan_on(
    c: &mut redis::Connection,
    url: &str,
    pattern: &str,
    keys: &mut Vec<String>,
) -> Result<(), Failure> {
    let mut cursor: u64 = 0;
    loop {
        let (next, batch): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(pattern)
            .arg("COUNT")
            .arg(1000)
            .query(c)
            .map_err(|e| redis_err(url, "SCAN", &e))?;
        keys.extend(batch);
        if next == 0 {
            return Ok(());
        }
        cursor = next;
    }
}

/// The masters' addresses, as URLs built from the seed URL (same scheme, credentials and db).
fn cluster_masters(seed: &str, nodes: &str) -> Vec<String> {
    let (scheme, rest) = seed.split_once("://").unwrap_or(("redis", seed));
    let auth = rest
        .rsplit_once('@')
        .map(|(a, _)| format!("{a}@"))
        .unwrap_or_default();
    let mut out = Vec::new();
    for line in nodes.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        let (Some(addr), Some(flags)) = (f.get(1), f.get(2)) else {
            continue;
        };
        if !flags.split(',').any(|x| x == "master") || flags.contains("fail") {
            continue;
        }
        // `ip:port@cport[,hostname]`; a master with no slots serves no key.
        if f.len() <= 8 {
            continue;
        }
        let hostport = addr.split(['@', ',']).next().unwrap_or(addr);
        out.push(format!("{scheme}://{auth}{hostport}"));
    }
    out
}

/// An integer reply or value (Redis answers `GET` with a bulk string).
pub fn as_i64(v: &Value) -> Option<i64> {
    match v {
        Value::Int(i) => Some(*i),
        Value::BulkString(b) => std::str::from_utf8(b).ok()?.trim().parse().ok(),
        Value::SimpleString(s) => s.trim().parse().ok(),
        _ => None,
    }
}

/// A string reply (`None` for nil).
pub fn as_string(v: &Value) -> Option<String> {
    match v {
        Value::BulkString(b) => Some(String::from_utf8_lossy(b).to_string()),
        Value::SimpleString(s) => Some(s.clone()),
        Value::Int(i) => Some(i.to_string()),
        _ => None,
    }
}

/// The field → value pairs of an `HGETALL` reply.
pub fn as_pairs(v: &Value) -> Vec<(String, String)> {
    match v {
        Value::Array(a) => a
            .chunks(2)
            .filter_map(|p| match p {
                [k, v] => Some((as_string(k)?, as_string(v)?)),
                _ => None,
            })
            .collect(),
        Value::Map(m) => m
            .iter()
            .filter_map(|(k, v)| Some((as_string(k)?, as_string(v)?)))
            .collect(),
        _ => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_schema_version_is_the_quota_protocol_number() {
        assert_eq!(schema_version(), "3");
    }

    #[test]
    fn cluster_masters_are_the_masters_holding_slots() {
        let nodes = "\
a1 127.0.0.1:7001@17001 myself,master - 0 0 1 connected 0-5460
a2 127.0.0.1:7002@17002 master - 0 0 2 connected 5461-10922
a3 127.0.0.1:7003@17003 slave a1 0 0 1 connected
a4 127.0.0.1:7004@17004 master,fail - 0 0 4 disconnected 10923-16383
a5 127.0.0.1:7005@17005 master - 0 0 5 connected
";
        assert_eq!(
            cluster_masters("redis://:pw@127.0.0.1:7001", nodes),
            vec!["redis://:pw@127.0.0.1:7001", "redis://:pw@127.0.0.1:7002"]
        );
    }
}
