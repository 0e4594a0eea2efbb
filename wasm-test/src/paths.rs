//! Locating things (the repository, Envoy, the built `.wasm`, the mock provider), free loopback
//! ports, temporary directories, and stopping a child process by PID.

use std::fs;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Repository root: the parent of this package's directory.
pub fn repo_root() -> PathBuf {
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    manifest.parent().map(Path::to_path_buf).unwrap_or(manifest)
}

/// Envoy binary: `$ENVOY_BIN`, else `<root>/.venv/bin/envoy`, else `/tmp/venvtest/bin/envoy`.
pub fn envoy_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("ENVOY_BIN") {
        return PathBuf::from(p);
    }
    let venv = repo_root().join(".venv/bin/envoy");
    if venv.exists() {
        return venv;
    }
    PathBuf::from("/tmp/venvtest/bin/envoy")
}

/// Filter module: `$TOKENGATE_WASM`, else `<root>/target/wasm32-wasip1/release/tokengate.wasm`.
pub fn wasm_path() -> PathBuf {
    match std::env::var_os("TOKENGATE_WASM") {
        Some(p) => PathBuf::from(p),
        None => repo_root().join("target/wasm32-wasip1/release/tokengate.wasm"),
    }
}

/// [`wasm_path`], panicking with instructions when the file does not exist.
pub fn require_wasm() -> PathBuf {
    let p = wasm_path();
    if !p.is_file() {
        panic!(
            "tokengate.wasm not found at {}: run `make build` first (or set TOKENGATE_WASM)",
            p.display()
        );
    }
    p
}

/// The `mock-provider` binary: `$MOCK_PROVIDER_BIN`, else next to the running test executable
/// (`target/<profile>/mock-provider`; Cargo builds it before integration tests run).
pub fn mock_provider_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("MOCK_PROVIDER_BIN") {
        return PathBuf::from(p);
    }
    let exe = std::env::current_exe().unwrap_or_default();
    let mut dir = exe.parent().map(Path::to_path_buf).unwrap_or_default();
    if dir.ends_with("deps") {
        dir.pop();
    }
    dir.join(format!("mock-provider{}", std::env::consts::EXE_SUFFIX))
}

/// Starts a [`MockProvider`] from the binary Cargo built for the calling integration test
/// (`env!("CARGO_BIN_EXE_mock-provider")`, resolved at the call site).
#[macro_export]
macro_rules! mock_provider {
    () => {
        $crate::MockProvider::start_with(::std::path::Path::new(env!(
            "CARGO_BIN_EXE_mock-provider"
        )))
    };
}

/// A free TCP port on 127.0.0.1 (bound then released), never one this process was given before:
/// the OS may hand a released port out again at once (this stop's CI: two Redis Cluster nodes got
/// the same port, and the one that could not bind was taken for up by the other's answer).
pub fn free_port() -> u16 {
    static GIVEN: std::sync::Mutex<Vec<u16>> = std::sync::Mutex::new(Vec::new());
    let mut given = GIVEN
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    for _ in 0..1000 {
        let port = match TcpListener::bind(("127.0.0.1", 0)).and_then(|l| l.local_addr()) {
            Ok(a) => a.port(),
            Err(e) => panic!("cannot bind 127.0.0.1:0: {e}"),
        };
        if !given.contains(&port) {
            given.push(port);
            return port;
        }
    }
    panic!("no loopback port this process was not given already, in 1000 tries");
}

/// A fresh directory under `std::env::temp_dir()`, removed on drop unless `KEEP_TMP` is set.
pub struct TempDir {
    path: PathBuf,
}

impl TempDir {
    /// Creates `<tmp>/tokengate-<prefix>-<pid>-<n>-<nanos>`.
    pub fn new(prefix: &str) -> TempDir {
        static N: AtomicU64 = AtomicU64::new(0);
        loop {
            let nanos = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.subsec_nanos())
                .unwrap_or(0);
            let n = N.fetch_add(1, Ordering::Relaxed);
            let path = std::env::temp_dir().join(format!(
                "tokengate-{prefix}-{}-{n}-{nanos}",
                std::process::id()
            ));
            match fs::create_dir(&path) {
                Ok(()) => return TempDir { path },
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                Err(e) => panic!("cannot create {}: {e}", path.display()),
            }
        }
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        if std::env::var_os("KEEP_TMP").is_some() {
            eprintln!("KEEP_TMP: kept {}", self.path.display());
        } else {
            let _ = fs::remove_dir_all(&self.path);
        }
    }
}

/// SIGTERM by PID, wait up to `grace`, then SIGKILL; always reaps.
pub fn terminate(child: &mut Child, grace: Duration) {
    if let Ok(Some(_)) = child.try_wait() {
        return;
    }
    let _ = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
    let deadline = Instant::now() + grace;
    while Instant::now() < deadline {
        if let Ok(Some(_)) = child.try_wait() {
            return;
        }
        thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// The last `lines` lines of `text`.
pub fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}
