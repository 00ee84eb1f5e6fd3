//! A PMI-1 client (the "simple" wire protocol MPICH's Hydra, Intel MPI and Slurm's `--mpi=pmi2`
//! compatibility serve over the socket named by `PMI_FD`): the CPU-only channel ranks of a PMI
//! launch use to all-gather small host data before, or without, NVSHMEM (`halo route` under
//! `mpiexec`, and the CI test of fact gathering). Runs that start NVSHMEM gather through NVSHMEM
//! instead ([`crate::nvshmem::Nvshmem::all_gather_bytes`]): NVSHMEM's PMI bootstrap owns this
//! socket once it initialises, so a process uses one or the other.
//!
//! The protocol is line-based `key=value` words: `cmd=init pmi_version=1 pmi_subversion=1`,
//! `cmd=get_maxes`, `cmd=get_my_kvsname`, `cmd=put kvsname=K key=k value=v`, `cmd=barrier_in`
//! (answered `cmd=barrier_out` once every rank entered), `cmd=get kvsname=K key=k`,
//! `cmd=finalize`. Values here are hex, split into chunks below the server's `vallen_max`.

use super::LaunchError;
use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::os::fd::FromRawFd;
use std::os::unix::net::UnixStream;
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

/// How long one answer may take (a barrier waits for the slowest rank).
pub const PMI_TIMEOUT: Duration = Duration::from_secs(120);

/// A connected, initialised PMI-1 client.
pub struct PmiClient {
    reader: BufReader<UnixStream>,
    writer: UnixStream,
    kvsname: String,
    rank: usize,
    size: usize,
    keylen_max: usize,
    vallen_max: usize,
}

fn pmi_err(reason: impl Into<String>) -> LaunchError {
    LaunchError::Pmi(reason.into())
}

/// Splits an answer line into its words: `cmd=x rc=0 value=...`.
pub fn parse_words(line: &str) -> HashMap<String, String> {
    line.split_whitespace().filter_map(|w| w.split_once('=')).map(|(k, v)| (k.to_owned(), v.to_owned())).collect()
}

/// Hex text of `bytes` (values must not hold spaces or `=`).
pub fn to_hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The bytes of hex text, or `None` when it is not hex.
pub fn from_hex(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) {
        return None;
    }
    (0..text.len()).step_by(2).map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok()).collect()
}

impl PmiClient {
    /// Connects through `PMI_FD` (with `PMI_RANK`/`PMI_SIZE`) and initialises; `None` when the
    /// process was not started by a PMI-1 launcher.
    pub fn from_env() -> Result<Option<Self>, LaunchError> {
        let Ok(fd_text) = std::env::var("PMI_FD") else { return Ok(None) };
        let fd: i32 = fd_text.trim().parse().map_err(|_| LaunchError::BadRankEnv {
            variable: "PMI_FD",
            value: fd_text.clone(),
            reason: "not a file descriptor number".into(),
        })?;
        let index = |var: &'static str| -> Result<usize, LaunchError> {
            let v = std::env::var(var).map_err(|_| LaunchError::BadRankEnv {
                variable: var,
                value: String::new(),
                reason: "PMI_FD is set but this is not".into(),
            })?;
            v.trim().parse().map_err(|_| LaunchError::BadRankEnv { variable: var, value: v.clone(), reason: "not a non-negative integer".into() })
        };
        let (rank, size) = (index("PMI_RANK")?, index("PMI_SIZE")?);
        // SAFETY: PMI_FD names the socket the launcher opened for this process, inherited and
        // not used by anything else in it (NVSHMEM is not started when this channel is used).
        // The stream owns it from here and closes it when the client goes (at process exit).
        let stream = unsafe { UnixStream::from_raw_fd(fd) };
        stream.set_read_timeout(Some(PMI_TIMEOUT)).map_err(|e| pmi_err(format!("PMI_FD={fd} is not a socket: {e}")))?;
        let writer = stream.try_clone().map_err(|e| pmi_err(format!("PMI_FD={fd}: {e}")))?;
        let mut c = Self { reader: BufReader::new(stream), writer, kvsname: String::new(), rank, size, keylen_max: 64, vallen_max: 1024 };
        c.command("cmd=init pmi_version=1 pmi_subversion=1", "response_to_init")?;
        let maxes = c.command("cmd=get_maxes", "maxes")?;
        let num = |k: &str, d: usize| maxes.get(k).and_then(|v| v.parse().ok()).unwrap_or(d);
        (c.keylen_max, c.vallen_max) = (num("keylen_max", 64), num("vallen_max", 1024));
        c.kvsname = c.command("cmd=get_my_kvsname", "my_kvsname")?.remove("kvsname").ok_or_else(|| pmi_err("no kvsname in the answer"))?;
        Ok(Some(c))
    }

    /// This rank and the job's size, as the launcher said.
    pub fn rank_size(&self) -> (usize, usize) {
        (self.rank, self.size)
    }

    /// Sends one command and reads its answer, which must be `cmd=<expect>` with `rc=0` (when an
    /// `rc` is given).
    fn command(&mut self, line: &str, expect: &str) -> Result<HashMap<String, String>, LaunchError> {
        writeln!(self.writer, "{line}").map_err(|e| pmi_err(format!("sending `{line}`: {e}")))?;
        let mut answer = String::new();
        let n = self
            .reader
            .read_line(&mut answer)
            .map_err(|e| pmi_err(format!("no answer to `{line}` within {} s: {e} (did another rank fail?)", PMI_TIMEOUT.as_secs())))?;
        if n == 0 {
            return Err(pmi_err(format!("the launcher closed the PMI socket before answering `{line}`")));
        }
        let words = parse_words(&answer);
        if words.get("cmd").map(String::as_str) != Some(expect) {
            return Err(pmi_err(format!("`{line}` was answered `{}`, expected cmd={expect}", answer.trim())));
        }
        if words.get("rc").is_some_and(|rc| rc != "0") {
            return Err(pmi_err(format!("`{line}` failed: {}", answer.trim())));
        }
        Ok(words)
    }

    fn put(&mut self, key: &str, value: &str) -> Result<(), LaunchError> {
        if key.len() > self.keylen_max || value.len() > self.vallen_max {
            return Err(pmi_err(format!("key {key:?} or its value ({} bytes) is over the server's limits", value.len())));
        }
        let line = format!("cmd=put kvsname={} key={key} value={value}", self.kvsname);
        self.command(&line, "put_result").map(drop)
    }

    fn get(&mut self, key: &str) -> Result<String, LaunchError> {
        let line = format!("cmd=get kvsname={} key={key}", self.kvsname);
        self.command(&line, "get_result")?.remove("value").ok_or_else(|| pmi_err(format!("no value for {key}")))
    }

    /// Waits until every rank entered the barrier.
    pub fn barrier(&mut self) -> Result<(), LaunchError> {
        self.command("cmd=barrier_in", "barrier_out").map(drop)
    }

    /// Every rank's bytes, indexed by rank: each rank puts its bytes as hex chunks under
    /// `<tag>-<rank>-<chunk>` (and the chunk count under `<tag>-<rank>-n`), a barrier, then every
    /// rank reads everyone's. Collective; `tag` new for every call of a run.
    pub fn all_gather(&mut self, tag: &str, mine: &[u8]) -> Result<Vec<Vec<u8>>, LaunchError> {
        if !tag.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_') || tag.len() + 24 > self.keylen_max {
            return Err(LaunchError::BadTag(tag.to_owned()));
        }
        let hex = to_hex(mine);
        let chunk = (self.vallen_max.saturating_sub(16) / 2 * 2).max(2);
        let chunks: Vec<&str> =
            if hex.is_empty() { Vec::new() } else { (0..hex.len()).step_by(chunk).map(|i| &hex[i..(i + chunk).min(hex.len())]).collect() };
        for (i, c) in chunks.iter().enumerate() {
            self.put(&format!("{tag}-{}-{i}", self.rank), c)?;
        }
        self.put(&format!("{tag}-{}-n", self.rank), &chunks.len().to_string())?;
        self.barrier()?;
        let mut all = Vec::with_capacity(self.size);
        for r in 0..self.size {
            let n: usize =
                self.get(&format!("{tag}-{r}-n"))?.parse().map_err(|_| pmi_err(format!("rank {r}'s chunk count for {tag} is not a number")))?;
            let mut text = String::new();
            for i in 0..n {
                text.push_str(&self.get(&format!("{tag}-{r}-{i}"))?);
            }
            all.push(from_hex(&text).ok_or_else(|| pmi_err(format!("rank {r}'s value for {tag} is not hex")))?);
        }
        Ok(all)
    }

    /// Tells the launcher this rank is done with PMI.
    pub fn finalize(&mut self) -> Result<(), LaunchError> {
        self.command("cmd=finalize", "finalize_ack").map(drop)
    }
}

/// The process's one PMI client, connected on first use (PMI-1 allows one `init` per process).
pub fn client() -> Result<Option<&'static Mutex<PmiClient>>, LaunchError> {
    static CLIENT: OnceLock<Option<Mutex<PmiClient>>> = OnceLock::new();
    if let Some(c) = CLIENT.get() {
        return Ok(c.as_ref());
    }
    let made = PmiClient::from_env()?.map(Mutex::new);
    Ok(CLIENT.get_or_init(|| made).as_ref())
}

/// Finalises the process's PMI client if it was used (call once at the end of a command that
/// gathered through PMI; a launcher may count a rank that initialised and never finalised as
/// failed).
pub fn finalize() -> Result<(), LaunchError> {
    match client()? {
        Some(c) => c.lock().map_err(|_| pmi_err("the PMI client was poisoned"))?.finalize(),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_round_trips_and_rejects_non_hex() {
        let bytes: Vec<u8> = (0..=255).collect();
        assert_eq!(from_hex(&to_hex(&bytes)).unwrap(), bytes);
        assert_eq!(from_hex("").unwrap(), Vec::<u8>::new());
        assert!(from_hex("abc").is_none() && from_hex("zz").is_none());
    }

    #[test]
    fn answers_split_into_words() {
        let w = parse_words("cmd=maxes rc=0 kvsname_max=256 keylen_max=64 vallen_max=1024\n");
        assert_eq!(w["cmd"], "maxes");
        assert_eq!(w["vallen_max"], "1024");
    }

    /// A fake server on a socket pair: the client's init handshake, puts, a barrier and gets, with
    /// a value split over several chunks (a server that allows 64-byte values).
    #[test]
    fn all_gather_over_a_fake_pmi_server() {
        let (client_end, server_end) = UnixStream::pair().unwrap();
        let server = std::thread::spawn(move || {
            let mut kvs: HashMap<String, String> = HashMap::new();
            let mut reader = BufReader::new(server_end.try_clone().unwrap());
            let mut w = server_end;
            let mut line = String::new();
            while reader.read_line(&mut line).unwrap() > 0 {
                let words = parse_words(&line);
                let answer = match words["cmd"].as_str() {
                    "init" => "cmd=response_to_init rc=0 pmi_version=1 pmi_subversion=1".to_string(),
                    "get_maxes" => "cmd=maxes rc=0 kvsname_max=256 keylen_max=64 vallen_max=64".to_string(),
                    "get_my_kvsname" => "cmd=my_kvsname rc=0 kvsname=kvs_1".to_string(),
                    "put" => {
                        kvs.insert(words["key"].clone(), words["value"].clone());
                        "cmd=put_result rc=0".to_string()
                    }
                    "barrier_in" => "cmd=barrier_out".to_string(),
                    "get" => match kvs.get(&words["key"]) {
                        Some(v) => format!("cmd=get_result rc=0 value={v}"),
                        None => "cmd=get_result rc=1".to_string(),
                    },
                    "finalize" => "cmd=finalize_ack rc=0".to_string(),
                    other => panic!("unexpected {other}"),
                };
                writeln!(w, "{answer}").unwrap();
                line.clear();
            }
        });
        let mut c = PmiClient {
            reader: BufReader::new(client_end.try_clone().unwrap()),
            writer: client_end,
            kvsname: String::new(),
            rank: 0,
            size: 1,
            keylen_max: 64,
            vallen_max: 1024,
        };
        c.command("cmd=init pmi_version=1 pmi_subversion=1", "response_to_init").unwrap();
        let maxes = c.command("cmd=get_maxes", "maxes").unwrap();
        c.vallen_max = maxes["vallen_max"].parse().unwrap();
        c.kvsname = c.command("cmd=get_my_kvsname", "my_kvsname").unwrap()["kvsname"].clone();
        let mine: Vec<u8> = (0..200u8).collect();
        assert_eq!(c.all_gather("facts", &mine).unwrap(), vec![mine]);
        assert_eq!(c.all_gather("empty", &[]).unwrap(), vec![Vec::<u8>::new()]);
        assert!(matches!(c.all_gather("bad tag", &[1]), Err(LaunchError::BadTag(_))));
        let e = c.get("missing").unwrap_err().to_string();
        assert!(e.contains("failed"), "{e}");
        c.finalize().unwrap();
        drop(c);
        server.join().unwrap();
    }
}
