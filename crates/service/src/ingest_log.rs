//! The ingest log: what HTTP ingest writes to disk before it answers.
//!
//! `POST /api/v1/events` acknowledges events only once they are in this log (flushed to disk,
//! for every request written since the last flush at once: a group commit), as Prometheus' and
//! Loki's receivers acknowledge after their write-ahead log. Each event gets the next offset of
//! the log, and reaches the engine with it as its position, so a checkpoint records how far into
//! the log it covers. After a crash the service restores the checkpoint and reads the log on
//! from there: an acknowledged event is processed even if the process died before the engine
//! saw it. Segments wholly behind the stored checkpoint are deleted.
//!
//! On disk: segment files `<first offset>.log` of records `[length u32][crc32 u32][offset u64]
//! [line]`, little-endian, the CRC over the offset and the line. A record cut short by a crash
//! (never acknowledged: the flush had not returned) is cut off when the log is opened.

use std::fs::{File, OpenOptions};
use std::io::{BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};

/// A segment is closed and a new one started past this size, so that old ones can be deleted.
const SEGMENT_BYTES: u64 = 64 << 20;
const HEADER: usize = 16;
/// Longer than any event is let be (a request body is at most 16 MiB): a longer length is
/// damage, not a record.
const MAX_RECORD: usize = 64 << 20;

/// The writing end of the log.
pub struct IngestLog {
    dir: PathBuf,
    file: BufWriter<File>,
    /// Bytes in the current segment.
    len: u64,
    /// The offset the next record gets.
    next: u64,
    fsync: bool,
}

/// A segment file and the offset of its first record.
fn segments(dir: &Path) -> std::io::Result<Vec<(u64, PathBuf)>> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        let first = path
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.strip_suffix(".log"))
            .and_then(|n| n.parse::<u64>().ok());
        if let Some(first) = first {
            out.push((first, path));
        }
    }
    out.sort();
    Ok(out)
}

fn segment_path(dir: &Path, first: u64) -> PathBuf {
    dir.join(format!("{first:020}.log"))
}

/// Reads one record at the reader's position: `Ok(None)` at a clean end, `Err` for a record cut
/// short or damaged.
fn read_record(r: &mut impl Read) -> Result<Option<(u64, Vec<u8>)>, String> {
    let mut header = [0u8; HEADER];
    let mut got = 0;
    while got < HEADER {
        match r.read(&mut header[got..]) {
            Ok(0) if got == 0 => return Ok(None),
            Ok(0) => return Err("a record header cut short".into()),
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e.to_string()),
        }
    }
    let len = u32::from_le_bytes(header[0..4].try_into().expect("4 bytes")) as usize;
    let crc = u32::from_le_bytes(header[4..8].try_into().expect("4 bytes"));
    let offset = u64::from_le_bytes(header[8..16].try_into().expect("8 bytes"));
    if len > MAX_RECORD {
        return Err(format!("a record of {len} bytes, longer than any event"));
    }
    let mut line = vec![0u8; len];
    r.read_exact(&mut line).map_err(|_| "a record cut short".to_string())?;
    let mut hasher = crc32fast::Hasher::new();
    hasher.update(&header[8..16]);
    hasher.update(&line);
    if hasher.finalize() != crc {
        return Err(format!("record {offset} fails its checksum"));
    }
    Ok(Some((offset, line)))
}

impl IngestLog {
    /// Opens the log in `dir` (creating it), cutting off a record a crash left unfinished. New
    /// records get offsets from the last one's, and never below `at_least` (the stored
    /// checkpoint's position, in case the folder was emptied).
    pub fn open(dir: &Path, at_least: u64, fsync: bool) -> std::io::Result<IngestLog> {
        std::fs::create_dir_all(dir)?;
        let mut next = at_least;
        let mut tail: Option<(u64, PathBuf)> = None;
        if let Some((first, path)) = segments(dir)?.pop() {
            let mut reader = BufReader::new(File::open(&path)?);
            let mut good = 0u64;
            let mut last = None;
            loop {
                match read_record(&mut reader) {
                    Ok(Some((offset, line))) => {
                        good += (HEADER + line.len()) as u64;
                        last = Some(offset);
                    }
                    Ok(None) => break,
                    Err(e) => {
                        tracing::warn!(file = %path.display(), at = good, error = %e, "the ingest log ends in an unfinished record; cut off (it was never acknowledged)");
                        OpenOptions::new().write(true).open(&path)?.set_len(good)?;
                        break;
                    }
                }
            }
            next = next.max(last.map_or(first, |l| l + 1));
            // A segment that cannot take the next offsets (emptied, or behind `at_least`) is
            // left for truncation; a new one starts.
            if last.map_or(first, |l| l + 1) == next && good < SEGMENT_BYTES {
                tail = Some((good, path));
            }
        }
        let (len, path) = tail.unwrap_or_else(|| (0, segment_path(dir, next)));
        let file = OpenOptions::new().create(true).append(true).open(&path)?;
        if len == 0 {
            sync_dir(dir)?;
        }
        Ok(IngestLog { dir: dir.to_path_buf(), file: BufWriter::with_capacity(1 << 20, file), len, next, fsync })
    }

    /// The offset the next record gets.
    pub fn next_offset(&self) -> u64 {
        self.next
    }

    /// Appends lines, one record each, and returns the offset of the first. Not on disk until
    /// [`IngestLog::commit`].
    pub fn append<'a>(&mut self, lines: impl IntoIterator<Item = &'a [u8]>) -> std::io::Result<u64> {
        let first = self.next;
        for line in lines {
            if self.len >= SEGMENT_BYTES {
                self.rotate()?;
            }
            let offset = self.next.to_le_bytes();
            let mut hasher = crc32fast::Hasher::new();
            hasher.update(&offset);
            hasher.update(line);
            let len = u32::try_from(line.len()).map_err(|_| std::io::Error::other("a line over 4 GiB"))?;
            self.file.write_all(&len.to_le_bytes())?;
            self.file.write_all(&hasher.finalize().to_le_bytes())?;
            self.file.write_all(&offset)?;
            self.file.write_all(line)?;
            self.len += (HEADER + line.len()) as u64;
            self.next += 1;
        }
        Ok(first)
    }

    /// Puts everything appended so far on disk (unless the log was opened without fsync, when
    /// it only reaches the operating system).
    pub fn commit(&mut self) -> std::io::Result<()> {
        self.file.flush()?;
        if self.fsync {
            self.file.get_ref().sync_data()?;
        }
        Ok(())
    }

    fn rotate(&mut self) -> std::io::Result<()> {
        self.commit()?;
        let file = OpenOptions::new().create(true).append(true).open(segment_path(&self.dir, self.next))?;
        sync_dir(&self.dir)?;
        self.file = BufWriter::with_capacity(1 << 20, file);
        self.len = 0;
        Ok(())
    }
}

/// Makes a new file's name durable.
fn sync_dir(dir: &Path) -> std::io::Result<()> {
    File::open(dir)?.sync_all()
}

/// The records of the log in `dir` from offset `from` on, oldest first. A damaged record ends
/// its segment (reported), and reading goes on with the next one.
pub fn read_from(dir: &Path, from: u64) -> std::io::Result<impl Iterator<Item = (u64, Vec<u8>)>> {
    let all = segments(dir)?;
    // Segments that end before `from` are skipped whole: the next one starts at or before it.
    let start = all.iter().rposition(|(first, _)| *first <= from).unwrap_or(0);
    let mut files = all.into_iter().skip(start);
    let mut current: Option<(PathBuf, BufReader<File>)> = None;
    Ok(std::iter::from_fn(move || loop {
        if current.is_none() {
            let (_, path) = files.next()?;
            match File::open(&path) {
                Ok(f) => current = Some((path, BufReader::new(f))),
                Err(e) => {
                    tracing::error!(file = %path.display(), error = %e, "cannot read an ingest log segment");
                    continue;
                }
            }
        }
        let (path, reader) = current.as_mut().expect("opened above");
        match read_record(reader) {
            Ok(Some((offset, _))) if offset < from => continue,
            Ok(Some(record)) => return Some(record),
            Ok(None) => current = None,
            Err(e) => {
                tracing::error!(file = %path.display(), error = %e, "a damaged ingest log record; the rest of this segment is skipped");
                current = None;
            }
        }
    }))
}

/// Deletes the segments whose every record is before `offset` (covered by a stored
/// checkpoint). The newest segment is never deleted: it is the one being written. Returns how
/// many went.
pub fn truncate_before(dir: &Path, offset: u64) -> std::io::Result<usize> {
    let all = segments(dir)?;
    let mut deleted = 0;
    for pair in all.windows(2) {
        let ((_, path), (next_first, _)) = (&pair[0], &pair[1]);
        if *next_first <= offset {
            std::fs::remove_file(path)?;
            deleted += 1;
        }
    }
    Ok(deleted)
}

/// A segment's size, for tests that cut a record short.
#[cfg(test)]
fn size_of(path: &Path) -> u64 {
    use std::io::{Seek, SeekFrom};
    let mut f = File::open(path).expect("segment");
    f.seek(SeekFrom::End(0)).expect("seek")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("vigil-ingest-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    fn lines(log: &Path, from: u64) -> Vec<(u64, String)> {
        read_from(log, from).expect("readable").map(|(o, l)| (o, String::from_utf8(l).expect("utf-8"))).collect()
    }

    #[test]
    fn records_read_back_in_order_from_any_offset_and_offsets_go_on_after_a_reopen() {
        let d = dir("order");
        let mut log = IngestLog::open(&d, 0, true).expect("opens");
        assert_eq!(log.append([&b"a"[..], b"bb"]).expect("append"), 0);
        assert_eq!(log.append([&b"ccc"[..]]).expect("append"), 2);
        log.commit().expect("commit");
        drop(log);
        assert_eq!(lines(&d, 0), [(0, "a".into()), (1, "bb".into()), (2, "ccc".into())]);
        assert_eq!(lines(&d, 2), [(2, "ccc".into())]);
        let mut log = IngestLog::open(&d, 0, true).expect("reopens");
        assert_eq!(log.next_offset(), 3);
        log.append([&b"d"[..]]).expect("append");
        log.commit().expect("commit");
        assert_eq!(lines(&d, 3), [(3, "d".into())]);
        // A checkpoint ahead of the log (its folder emptied) moves offsets on.
        let fresh = dir("ahead");
        assert_eq!(IngestLog::open(&fresh, 40, true).expect("opens").next_offset(), 40);
        std::fs::remove_dir_all(&d).ok();
        std::fs::remove_dir_all(&fresh).ok();
    }

    #[test]
    fn a_record_cut_short_by_a_crash_is_cut_off_and_its_offset_reused() {
        let d = dir("torn");
        let mut log = IngestLog::open(&d, 0, false).expect("opens");
        log.append([&b"kept"[..], b"torn"]).expect("append");
        log.commit().expect("commit");
        drop(log);
        let (_, path) = segments(&d).expect("list").pop().expect("a segment");
        let full = size_of(&path);
        OpenOptions::new().write(true).open(&path).expect("open").set_len(full - 2).expect("cut");
        let log = IngestLog::open(&d, 0, false).expect("reopens");
        assert_eq!(log.next_offset(), 1, "the torn record's offset is given again");
        assert_eq!(lines(&d, 0), [(0, "kept".into())]);
        std::fs::remove_dir_all(&d).ok();
    }

    #[test]
    fn a_damaged_record_is_skipped_with_the_rest_of_its_segment() {
        let d = dir("damaged");
        let mut log = IngestLog::open(&d, 0, false).expect("opens");
        log.append([&b"one"[..], b"two"]).expect("append");
        log.commit().expect("commit");
        drop(log);
        let (_, path) = segments(&d).expect("list").pop().expect("a segment");
        let mut bytes = std::fs::read(&path).expect("read");
        let last = bytes.len() - 1;
        bytes[last] ^= 0xff;
        std::fs::write(&path, bytes).expect("write");
        assert_eq!(lines(&d, 0), [(0, "one".into())]);
        std::fs::remove_dir_all(&d).ok();
    }

    #[test]
    fn segments_behind_a_checkpoint_are_deleted_but_never_the_newest() {
        let d = dir("truncate");
        std::fs::create_dir_all(&d).expect("dir");
        for (first, records) in [(0u64, 3u64), (3, 2), (5, 1)] {
            let mut f = File::create(segment_path(&d, first)).expect("segment");
            for o in first..first + records {
                let line = format!("e{o}");
                let mut h = crc32fast::Hasher::new();
                h.update(&o.to_le_bytes());
                h.update(line.as_bytes());
                f.write_all(&(line.len() as u32).to_le_bytes()).expect("w");
                f.write_all(&h.finalize().to_le_bytes()).expect("w");
                f.write_all(&o.to_le_bytes()).expect("w");
                f.write_all(line.as_bytes()).expect("w");
            }
        }
        assert_eq!(truncate_before(&d, 4).expect("truncate"), 1, "only the segment of 0..3 is wholly behind 4");
        assert_eq!(lines(&d, 4), [(4, "e4".into()), (5, "e5".into())]);
        assert_eq!(truncate_before(&d, 100).expect("truncate"), 1);
        assert_eq!(segments(&d).expect("list").len(), 1, "the newest segment stays");
        assert_eq!(IngestLog::open(&d, 0, false).expect("opens").next_offset(), 6);
        std::fs::remove_dir_all(&d).ok();
    }
}
