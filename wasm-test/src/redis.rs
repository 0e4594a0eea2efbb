//! Redis and Webdis processes on free loopback ports, and a small RESP client for assertions.

use crate::*;
use serde_json::Value;
use std::fs;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

/// A `redis-server` on a free loopback port (no persistence).
pub struct RedisServer {
    /// Its port.
    pub port: u16,
    child: Child,
    _dir: TempDir,
}

impl RedisServer {
    /// Starts `$REDIS_SERVER` (default `redis-server`) and waits for PING (10 s).
    pub fn start() -> RedisServer {
        let dir = TempDir::new("redis");
        let port = free_port();
        let bin = std::env::var("REDIS_SERVER").unwrap_or_else(|_| "redis-server".into());
        let log = dir.path().join("redis.log");
        let mut child = Command::new(&bin)
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no", "--daemonize", "no"])
            .arg("--dir")
            .arg(dir.path())
            .arg("--logfile")
            .arg(&log)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot spawn {bin} (apt-get install redis-server): {e}"));
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if matches!(redis_cmd(port, &["PING"]), Ok(RespValue::Simple(ref s)) if s == "PONG") {
                break;
            }
            if let Ok(Some(st)) = child.try_wait() {
                panic!(
                    "redis-server exited {st}: {}",
                    fs::read_to_string(&log).unwrap_or_default()
                );
            }
            if Instant::now() >= deadline {
                terminate(&mut child, Duration::from_millis(500));
                panic!("redis-server not answering PING on {port}");
            }
            thread::sleep(Duration::from_millis(30));
        }
        RedisServer {
            port,
            child,
            _dir: dir,
        }
    }

    /// Runs a command against this server.
    pub fn cmd(&self, args: &[&str]) -> Result<RespValue, String> {
        redis_cmd(self.port, args)
    }

    /// PID of the process.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        terminate(&mut self.child, Duration::from_secs(2));
    }
}

/// A Webdis in front of a Redis port, on its own free HTTP port.
pub struct Webdis {
    /// Its HTTP port.
    pub port: u16,
    child: Child,
    dir: TempDir,
}

impl Webdis {
    /// Writes a config (`daemonize: false`, `verbosity: 3`, logfile in a temp dir), starts
    /// `$WEBDIS_BIN` (default `webdis`) and waits until `GET /PING` answers (10 s).
    pub fn start(redis_port: u16) -> Webdis {
        Webdis::start_with(redis_port, &serde_json::json!({}))
    }

    /// [`Webdis::start`] with the fields of the JSON object `extra` added to (or replacing those of) its
    /// config, e.g. `{"acl": [{"disabled": ["EVAL"]}]}`.
    pub fn start_with(redis_port: u16, extra: &Value) -> Webdis {
        let dir = TempDir::new("webdis");
        let port = free_port();
        let mut config = serde_json::json!({
            "redis_host": "127.0.0.1",
            "redis_port": redis_port,
            "redis_auth": null,
            "http_host": "127.0.0.1",
            "http_port": port,
            "threads": 2,
            "pool_size": 8,
            "daemonize": false,
            "websockets": false,
            "database": 0,
            "verbosity": 3,
            "logfile": dir.path().join("webdis.log").display().to_string(),
        });
        if let (Some(config), Some(extra)) = (config.as_object_mut(), extra.as_object()) {
            for (k, v) in extra {
                config.insert(k.clone(), v.clone());
            }
        }
        let cfg_path = dir.path().join("webdis.json");
        fs::write(&cfg_path, config.to_string()).unwrap_or_else(|e| panic!("webdis.json: {e}"));
        let bin = std::env::var("WEBDIS_BIN").unwrap_or_else(|_| "webdis".into());
        let mut child = Command::new(&bin)
            .arg(&cfg_path)
            .current_dir(dir.path())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot spawn {bin} (apt-get install webdis): {e}"));
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Ok(r) = http::request(port, "GET", "/PING", &[], b"", Duration::from_secs(1)) {
                if r.status == 200 && r.text().contains("PONG") {
                    break;
                }
            }
            if let Ok(Some(st)) = child.try_wait() {
                panic!(
                    "webdis exited {st}: {}",
                    fs::read_to_string(dir.path().join("webdis.log")).unwrap_or_default()
                );
            }
            if Instant::now() >= deadline {
                terminate(&mut child, Duration::from_millis(500));
                panic!("webdis not answering /PING on {port}");
            }
            thread::sleep(Duration::from_millis(30));
        }
        Webdis { port, child, dir }
    }

    /// Contents of webdis.log.
    pub fn log(&self) -> String {
        fs::read_to_string(self.dir.path().join("webdis.log")).unwrap_or_default()
    }

    /// PID of the process.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Webdis {
    fn drop(&mut self) {
        terminate(&mut self.child, Duration::from_secs(2));
    }
}

/// A RESP2 reply.
#[derive(Clone, Debug, PartialEq)]
pub enum RespValue {
    /// `+OK`
    Simple(String),
    /// `-ERR …`
    Error(String),
    /// `:1`
    Int(i64),
    /// `$…` (None = nil)
    Bulk(Option<Vec<u8>>),
    /// `*…` (None = nil array)
    Array(Option<Vec<RespValue>>),
}

impl RespValue {
    /// Bulk or simple string as text.
    pub fn as_str(&self) -> Option<String> {
        match self {
            RespValue::Simple(s) => Some(s.clone()),
            RespValue::Bulk(Some(b)) => Some(String::from_utf8_lossy(b).into_owned()),
            _ => None,
        }
    }

    /// Integer reply, or a bulk string holding an integer.
    pub fn as_int(&self) -> Option<i64> {
        match self {
            RespValue::Int(i) => Some(*i),
            other => other.as_str().and_then(|s| s.parse().ok()),
        }
    }
}

/// One command over a fresh connection to 127.0.0.1:`port` (2 s timeout).
pub fn redis_cmd(port: u16, args: &[&str]) -> Result<RespValue, String> {
    let stream = TcpStream::connect(("127.0.0.1", port)).map_err(|e| format!("connect: {e}"))?;
    stream
        .set_read_timeout(Some(Duration::from_secs(2)))
        .map_err(|e| e.to_string())?;
    let mut req = format!("*{}\r\n", args.len()).into_bytes();
    for a in args {
        req.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
        req.extend_from_slice(a.as_bytes());
        req.extend_from_slice(b"\r\n");
    }
    let mut w = stream.try_clone().map_err(|e| e.to_string())?;
    w.write_all(&req).map_err(|e| format!("write: {e}"))?;
    let mut r = BufReader::new(stream);
    read_resp(&mut r)
}

/// One kept-open Redis connection that sends commands in pipelined batches (for load in tests).
pub struct RedisConn {
    w: TcpStream,
    r: BufReader<TcpStream>,
}

impl RedisConn {
    /// Connects to the Redis on `port`.
    pub fn connect(port: u16) -> Result<RedisConn, String> {
        let stream =
            TcpStream::connect(("127.0.0.1", port)).map_err(|e| format!("connect: {e}"))?;
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .map_err(|e| e.to_string())?;
        let w = stream.try_clone().map_err(|e| e.to_string())?;
        Ok(RedisConn {
            w,
            r: BufReader::new(stream),
        })
    }

    /// Sends every command (each a list of arguments) at once, then reads one reply per command.
    pub fn pipeline(&mut self, cmds: &[Vec<Vec<u8>>]) -> Result<Vec<RespValue>, String> {
        let mut req = Vec::new();
        for args in cmds {
            req.extend_from_slice(format!("*{}\r\n", args.len()).as_bytes());
            for a in args {
                req.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
                req.extend_from_slice(a);
                req.extend_from_slice(b"\r\n");
            }
        }
        self.w.write_all(&req).map_err(|e| format!("write: {e}"))?;
        cmds.iter().map(|_| read_resp(&mut self.r)).collect()
    }
}

fn read_resp(r: &mut BufReader<TcpStream>) -> Result<RespValue, String> {
    let mut line = String::new();
    r.read_line(&mut line).map_err(|e| format!("read: {e}"))?;
    let line = line.trim_end_matches(['\r', '\n']);
    let (kind, rest) = line.split_at(line.len().min(1));
    let num = || {
        rest.parse::<i64>()
            .map_err(|e| format!("bad RESP {line:?}: {e}"))
    };
    match kind {
        "+" => Ok(RespValue::Simple(rest.to_string())),
        "-" => Ok(RespValue::Error(rest.to_string())),
        ":" => Ok(RespValue::Int(num()?)),
        "$" => {
            let n = num()?;
            if n < 0 {
                return Ok(RespValue::Bulk(None));
            }
            let mut buf = vec![0u8; n as usize + 2];
            r.read_exact(&mut buf).map_err(|e| format!("read: {e}"))?;
            buf.truncate(n as usize);
            Ok(RespValue::Bulk(Some(buf)))
        }
        "*" => {
            let n = num()?;
            if n < 0 {
                return Ok(RespValue::Array(None));
            }
            let mut items = Vec::with_capacity(n as usize);
            for _ in 0..n {
                items.push(read_resp(r)?);
            }
            Ok(RespValue::Array(Some(items)))
        }
        _ => Err(format!("bad RESP line {line:?}")),
    }
}
