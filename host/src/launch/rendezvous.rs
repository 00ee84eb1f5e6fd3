//! Hands small blobs between the ranks of one `halo launch`: NVSHMEM's unique id from rank 0 to the
//! others, and all-gathers such as host identities.
//!
//! The channel is a directory that only the launching user can enter (0700), created by the
//! launcher and passed as `HALO_RENDEZVOUS_DIR`. A file appears there only by `rename` of a fully
//! written, synced 0600 temporary file, so a reader that sees a name sees all of its bytes: no
//! locking, no partial reads. Readers poll with a bounded wait so a rank that died before publishing
//! becomes an error naming it rather than a hang. The launcher removes the directory when the run ends.
//!
//! Only ranks of one node can use it (the directory is local); under `mpirun`/`srun` NVSHMEM
//! bootstraps through MPI/PMI instead and needs no rendezvous.

use super::LaunchError;
use super::env::{ENV_NRANKS, ENV_RANK, ENV_RENDEZVOUS_DIR, RankEnv};
use std::fs::{self, DirBuilder, OpenOptions};
use std::io::{ErrorKind, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// How long [`all_gather`] waits for the slowest rank by default.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);

/// The file name rank 0 publishes NVSHMEM's unique id under.
const UNIQUE_ID_FILE: &str = "unique-id";

/// Rank 0 publishes NVSHMEM's unique id (or any blob) for the other ranks of this `halo launch`.
///
/// Reads the directory and rank from the environment `halo launch` sets; see [`Rendezvous::publish`].
pub fn publish(bytes: &[u8]) -> Result<(), LaunchError> {
    Rendezvous::from_env()?.publish(bytes)
}

/// Waits up to `timeout` for rank 0's [`publish`] and returns the blob.
///
/// Reads the directory and rank from the environment `halo launch` sets; see [`Rendezvous::fetch`].
pub fn fetch(timeout: Duration) -> Result<Vec<u8>, LaunchError> {
    Rendezvous::from_env()?.fetch(timeout)
}

/// Every rank contributes `my_bytes` under `tag` and gets all ranks' contributions, indexed by rank,
/// waiting at most [`DEFAULT_TIMEOUT`]. See [`Rendezvous::all_gather`].
pub fn all_gather(tag: &str, my_bytes: &[u8]) -> Result<Vec<Vec<u8>>, LaunchError> {
    Rendezvous::from_env()?.all_gather(tag, my_bytes, DEFAULT_TIMEOUT)
}

/// One rank's view of a rendezvous directory.
#[derive(Debug, Clone)]
pub struct Rendezvous {
    dir: PathBuf,
    rank: usize,
    nranks: usize,
}

impl Rendezvous {
    /// A rendezvous in `dir` for `rank` of `nranks` (for callers that know them; ranks normally use
    /// [`Rendezvous::from_env`]).
    pub fn new(dir: impl Into<PathBuf>, rank: usize, nranks: usize) -> Rendezvous {
        Rendezvous { dir: dir.into(), rank, nranks }
    }

    /// The rendezvous `halo launch` set up for this process: `HALO_RENDEZVOUS_DIR`, `HALO_RANK` and
    /// `HALO_NRANKS`.
    pub fn from_env() -> Result<Rendezvous, LaunchError> {
        let dir = std::env::var_os(ENV_RENDEZVOUS_DIR).ok_or(LaunchError::NoRendezvous)?;
        match RankEnv::try_from_env()? {
            Some(env) if env.source == "halo launch" => Ok(Rendezvous::new(dir, env.rank, env.nranks)),
            _ => Err(LaunchError::BadRankEnv {
                variable: ENV_RANK,
                value: String::new(),
                reason: format!("{ENV_RENDEZVOUS_DIR} is set but {ENV_RANK}/{ENV_NRANKS} are not"),
            }),
        }
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// This process's rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Number of ranks.
    pub fn nranks(&self) -> usize {
        self.nranks
    }

    /// Publishes `bytes` (NVSHMEM's 128-byte unique id) for the other ranks; only rank 0 may, once.
    pub fn publish(&self, bytes: &[u8]) -> Result<(), LaunchError> {
        if self.rank != 0 {
            return Err(LaunchError::NotRankZero { rank: self.rank });
        }
        self.write_once(UNIQUE_ID_FILE, bytes)
    }

    /// Waits up to `timeout` for rank 0's [`Rendezvous::publish`] and returns what it published.
    pub fn fetch(&self, timeout: Duration) -> Result<Vec<u8>, LaunchError> {
        let path = self.dir.join(UNIQUE_ID_FILE);
        let deadline = Instant::now() + timeout;
        let mut pause = Duration::from_millis(1);
        loop {
            match fs::read(&path) {
                Ok(bytes) => return Ok(bytes),
                Err(e) if e.kind() == ErrorKind::NotFound => {}
                Err(source) => return Err(LaunchError::RendezvousIo { what: "reading", path, source }),
            }
            if Instant::now() >= deadline {
                return Err(LaunchError::RendezvousTimeout { what: "NVSHMEM's unique id".into(), missing: vec![0], timeout, dir: self.dir.clone() });
            }
            pause = sleep_step(pause, deadline);
        }
    }

    /// Every rank writes `my_bytes` as `<tag>.<rank>` and then waits up to `timeout` until all
    /// `nranks` files exist; returns their contents indexed by rank.
    ///
    /// `tag` must be made of ASCII letters, digits, `-` and `_` and be used once per run (a second
    /// all-gather under the same tag would read the first one's files, so it is refused).
    pub fn all_gather(&self, tag: &str, my_bytes: &[u8], timeout: Duration) -> Result<Vec<Vec<u8>>, LaunchError> {
        if tag.is_empty() || !tag.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_') {
            return Err(LaunchError::BadTag(tag.to_owned()));
        }
        self.write_once(&format!("{tag}.{}", self.rank), my_bytes)?;
        let deadline = Instant::now() + timeout;
        let mut gathered: Vec<Option<Vec<u8>>> = vec![None; self.nranks];
        let mut pause = Duration::from_millis(1);
        loop {
            for (rank, slot) in gathered.iter_mut().enumerate().filter(|(_, s)| s.is_none()) {
                let path = self.dir.join(format!("{tag}.{rank}"));
                match fs::read(&path) {
                    Ok(bytes) => *slot = Some(bytes),
                    Err(e) if e.kind() == ErrorKind::NotFound => {}
                    Err(source) => return Err(LaunchError::RendezvousIo { what: "reading", path, source }),
                }
            }
            let missing: Vec<usize> = (0..self.nranks).filter(|&r| gathered[r].is_none()).collect();
            if missing.is_empty() {
                return Ok(gathered.into_iter().flatten().collect());
            }
            if Instant::now() >= deadline {
                return Err(LaunchError::RendezvousTimeout { what: format!("all-gather `{tag}`"), missing, timeout, dir: self.dir.clone() });
            }
            pause = sleep_step(pause, deadline);
        }
    }

    /// Writes `name` atomically (temporary file, fsync, rename), refusing to replace an existing one.
    fn write_once(&self, name: &str, bytes: &[u8]) -> Result<(), LaunchError> {
        let path = self.dir.join(name);
        if path.exists() {
            return Err(LaunchError::AlreadyPublished(path));
        }
        // The leading dot keeps readers from ever matching the temporary name.
        let tmp = self.dir.join(format!(".{name}.tmp.{}", std::process::id()));
        let mut file = OpenOptions::new().write(true).create_new(true).mode(0o600).open(&tmp).map_err(io_error("creating", &tmp))?;
        file.write_all(bytes).and_then(|()| file.sync_all()).map_err(io_error("writing", &tmp))?;
        drop(file);
        fs::rename(&tmp, &path).map_err(io_error("renaming into place", &path))
    }
}

/// Maps an OS error while `what`-ing `path` into [`LaunchError::RendezvousIo`].
fn io_error(what: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> LaunchError + use<> {
    let path = path.to_owned();
    move |source| LaunchError::RendezvousIo { what, path, source }
}

/// Sleeps a little longer each round (1 ms up to 50 ms), never past `deadline`; returns the next pause.
fn sleep_step(pause: Duration, deadline: Instant) -> Duration {
    let left = deadline.saturating_duration_since(Instant::now());
    std::thread::sleep(pause.min(left));
    (pause * 2).min(Duration::from_millis(50))
}

/// The launcher's private rendezvous directory; removed with everything in it on drop.
#[derive(Debug)]
pub struct RendezvousDir {
    path: PathBuf,
}

impl RendezvousDir {
    /// Creates a fresh directory `halo-launch.<pid>.<random>` under the system temporary directory
    /// (`TMPDIR`), mode 0700.
    pub fn create() -> Result<RendezvousDir, LaunchError> {
        Self::create_in(&std::env::temp_dir())
    }

    /// Like [`RendezvousDir::create`], under `parent`.
    pub fn create_in(parent: &Path) -> Result<RendezvousDir, LaunchError> {
        // mkdir never follows or reuses an existing name, so a random name that someone else
        // created first is simply skipped; a few attempts are plenty.
        let mut last_error = None;
        for _ in 0..16 {
            let path = parent.join(format!("halo-launch.{}.{:016x}", std::process::id(), rand::random::<u64>()));
            match DirBuilder::new().mode(0o700).create(&path) {
                Ok(()) => {
                    let dir = RendezvousDir { path };
                    // The umask can only take bits away; set 0700 exactly so the owner can always write.
                    fs::set_permissions(&dir.path, fs::Permissions::from_mode(0o700)).map_err(|source| LaunchError::RendezvousIo {
                        what: "setting permissions of",
                        path: dir.path.clone(),
                        source,
                    })?;
                    return Ok(dir);
                }
                Err(e) if e.kind() == ErrorKind::AlreadyExists => last_error = Some((path, e)),
                Err(source) => return Err(LaunchError::RendezvousIo { what: "creating", path, source }),
            }
        }
        let (path, source) = last_error.unwrap_or_else(|| (parent.to_owned(), ErrorKind::AlreadyExists.into()));
        Err(LaunchError::RendezvousIo { what: "creating", path, source })
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for RendezvousDir {
    fn drop(&mut self) {
        if let Err(e) = fs::remove_dir_all(&self.path)
            && e.kind() != ErrorKind::NotFound
        {
            tracing::warn!("could not remove the rendezvous directory {}: {e}", self.path.display());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn directory_is_private_and_removed() {
        let dir = RendezvousDir::create().expect("create");
        let path = dir.path().to_owned();
        let mode = fs::metadata(&path).expect("metadata").permissions().mode() & 0o777;
        assert_eq!(mode, 0o700);
        Rendezvous::new(&path, 0, 1).publish(&[1, 2, 3]).expect("publish");
        let file_mode = fs::metadata(path.join(UNIQUE_ID_FILE)).expect("metadata").permissions().mode() & 0o777;
        assert_eq!(file_mode, 0o600);
        drop(dir);
        assert!(!path.exists());
    }

    #[test]
    fn publish_fetch_and_gather_between_threads() {
        let dir = RendezvousDir::create().expect("create");
        let n = 4;
        let handles: Vec<_> = (0..n)
            .map(|rank| {
                let rv = Rendezvous::new(dir.path(), rank, n);
                std::thread::spawn(move || {
                    let id = if rank == 0 {
                        let id: Vec<u8> = (0..128u32).map(|i| (i * 7 + 3) as u8).collect();
                        rv.publish(&id).map(|()| id)
                    } else {
                        rv.fetch(Duration::from_secs(10))
                    };
                    let all = rv.all_gather("host", format!("host-{rank}").as_bytes(), Duration::from_secs(10));
                    (id, all)
                })
            })
            .collect();
        for h in handles {
            let (id, all) = h.join().expect("thread");
            let id = id.expect("unique id");
            assert_eq!(id.len(), 128);
            assert_eq!(id[1], 10);
            let all = all.expect("all_gather");
            assert_eq!(all, (0..n).map(|r| format!("host-{r}").into_bytes()).collect::<Vec<_>>());
        }
    }

    #[test]
    fn misuse_and_timeouts_are_errors() {
        let dir = RendezvousDir::create().expect("create");
        let rank1 = Rendezvous::new(dir.path(), 1, 2);
        assert!(matches!(rank1.publish(b"x"), Err(LaunchError::NotRankZero { rank: 1 })));
        let err = rank1.fetch(Duration::from_millis(30)).unwrap_err();
        assert!(err.to_string().contains("rank 0"), "{err}");
        let err = rank1.all_gather("t", b"x", Duration::from_millis(30)).unwrap_err();
        assert!(err.to_string().contains("rank 0"), "{err}");
        assert!(matches!(rank1.all_gather("t", b"x", Duration::ZERO), Err(LaunchError::AlreadyPublished(_))));
        assert!(matches!(rank1.all_gather("../x", b"x", Duration::ZERO), Err(LaunchError::BadTag(_))));
        let rank0 = Rendezvous::new(dir.path(), 0, 2);
        rank0.publish(b"id").expect("publish");
        assert!(matches!(rank0.publish(b"id"), Err(LaunchError::AlreadyPublished(_))));
    }
}
