//! Input adapters: JSON lines (canonical) and the recorded formats of `../shared/data`, each
//! turned into [`Event`]s with the line they came from. Adapters know nothing of the engine.
//!
//! | format | file | becomes |
//! |---|---|---|
//! | `jsonl` | one event object per line | any stream |
//! | `nab` | NAB `timestamp,value` CSV | `metric`, host and name from the file name or flags |
//! | `google-task-events`, `google-task-usage`, `google-machine-events` | Google 2011 trace CSV, microsecond times | `task_event`, `task_usage`, `machine_event` |
//! | `alibaba-batch-task` | Alibaba 2017 batch_task CSV | `task_event`: SUBMIT at creation, SCHEDULE and FINISH or FAIL as the status says |
//! | `alibaba-server-event` | Alibaba 2017 server_event CSV | `machine_event` |
//! | `azure-cpu` | Azure Public Dataset V1 CPU readings, `t_offset_s,step,vm_id,avg_cpu,max_cpu` | `metric`: host the VM, names `avg_cpu` and `max_cpu` |
//! | `influx` | InfluxDB line protocol (Telegraf's files and Kafka output), [`crate::influx`] | `metric`: one event per numeric field |
//! | `telegraf-json` | Telegraf's JSON output, a metric (or a batch) per line, [`crate::influx::telegraf_json`] | `metric`: one event per numeric field |
//! | `otlp-json` | OTLP metrics in OTLP's JSON, a request per line (the Collector's file exporter, a capture of an `otlp_json` topic), [`crate::otlp`] | `metric`: one event per point (histograms and summaries: several) |
//! | `prometheus-kafka-adapter` | prometheus-kafka-adapter's JSON, a sample per line, [`crate::remote_write::adapter_sample`] | `metric` |
//! | `planetlab` | PlanetLab (CoMon) CPU: one integer per line, every 5 minutes from the date its folder is named after (`20110303/`) | `metric`: host the file name, name `cpu_utilization` |
//!
//! `.gz` files are decompressed on the fly.

mod collectors;

pub use crate::Format;
use std::cell::RefCell;
use std::fs::File;
use std::io::{BufRead, BufReader, Read};
use std::path::Path;
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use vigil_engine::engine::Gate;
use vigil_engine::event::{DecodeError, Decoded, Event, EventPool, LineDecoder, Millis, Value};
use vigil_lang::schema::Stream;

/// Options for adapters that cannot learn everything from the file.
#[derive(Debug, Clone)]
pub struct InputOptions {
    /// Host of NAB series (default: from the file name).
    pub host: Option<String>,
    /// Metric name of NAB series (default: from the file name).
    pub metric_name: Option<String>,
    /// How the collectors' formats name a sample's host (and line protocol's precision).
    pub hosts: crate::HostMapping,
    /// The streams JSON lines may name: the rules' ([`vigil_lang::ruleset::RuleSet::catalog`]).
    pub catalog: vigil_lang::schema::Catalog,
}

impl Default for InputOptions {
    fn default() -> Self {
        InputOptions {
            host: None,
            metric_name: None,
            hosts: Default::default(),
            catalog: vigil_lang::schema::Catalog::prelude().clone(),
        }
    }
}

pub use vigil_engine::replay::{Input, Record};

struct Counting<R> {
    inner: R,
    read: Arc<AtomicU64>,
}

impl<R: Read> Read for Counting<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.read.fetch_add(n as u64, Ordering::Relaxed);
        Ok(n)
    }
}

/// Opens a file with the given (or detected) format.
pub fn open(path: &Path, format: Format, options: &InputOptions) -> std::io::Result<Input> {
    let mut decoder = LineDecoder::new(options.catalog.clone());
    open_with(path, format, options, move |line| decoder.decode_bytes(line, None), |records| records)
}

/// [`open`] for an engine that takes times alone: JSON lines that `gate` shows no rule takes
/// come back as [`Decoded::Time`], checked but not built. Other formats are decoded in full.
///
/// Events are read into those of `pool`, which the caller fills from the engine
/// ([`vigil_engine::engine::Engine::recycle_into`]): it owns both ends.
pub fn open_gated(
    path: &Path,
    format: Format,
    options: &InputOptions,
    gate: Gate,
    pool: Rc<RefCell<EventPool>>,
) -> std::io::Result<Input<Decoded>> {
    let mut decoder = LineDecoder::new(options.catalog.clone());
    open_with(
        path,
        format,
        options,
        move |line| decoder.decode_gated(line, None, &gate, &mut pool.borrow_mut()),
        |records| {
            Box::new(records.map(|r| Record { line: r.line, event: r.event.map(|e| Decoded::Event(Arc::new(e))) }))
        },
    )
}

type Records<T> = Box<dyn Iterator<Item = Record<T>>>;

/// Opens a file: JSON lines decoded with `decode`, other formats' records passed through `wrap`.
fn open_with<T: 'static>(
    path: &Path,
    format: Format,
    options: &InputOptions,
    decode: impl FnMut(&[u8]) -> Result<T, DecodeError> + 'static,
    wrap: impl FnOnce(Records<Event>) -> Records<T>,
) -> std::io::Result<Input<T>> {
    let file = File::open(path)?;
    let size = file.metadata()?.len();
    let progress = Arc::new(AtomicU64::new(0));
    let counted = Counting { inner: file, read: progress.clone() };
    let name = path.display().to_string();
    let gz = path.extension().is_some_and(|e| e == "gz");
    let reader: Box<dyn BufRead> = if gz {
        Box::new(BufReader::with_capacity(1 << 16, flate2::read::GzDecoder::new(counted)))
    } else {
        Box::new(BufReader::with_capacity(1 << 16, counted))
    };
    let mut reader = reader;
    let format = match format {
        Format::Auto => detect(path, reader.fill_buf()?),
        f => f,
    };
    let stem = file_stem(path);
    let records: Records<Event> = match format {
        Format::Auto | Format::Jsonl => {
            return Ok(Input { name, records: Box::new(jsonl(reader, decode)), progress, size })
        }
        Format::Nab => {
            let (host, name) = nab_series(&stem, options);
            Box::new(csv_records(reader, true, move |row| nab_row(row, &host, &name)))
        }
        Format::GoogleTaskEvents => Box::new(csv_records(reader, false, google_task_event)),
        Format::GoogleTaskUsage => Box::new(csv_records(reader, false, google_task_usage)),
        Format::GoogleMachineEvents => Box::new(csv_records(reader, false, google_machine_event)),
        Format::AlibabaServerEvent => Box::new(csv_records(reader, false, alibaba_server_event)),
        Format::AlibabaBatchTask => Box::new(alibaba_batch_task(reader)),
        Format::AzureCpu => Box::new(csv_rows(reader, true, azure_cpu)),
        Format::Influx | Format::TelegrafJson | Format::OtlpJson | Format::PrometheusKafkaAdapter => {
            collectors::records(reader, format, options)
        }
        Format::OtlpProto | Format::RemoteWrite => {
            let why = format.refusal(crate::Carrier::File).unwrap_or_default();
            return Err(std::io::Error::new(std::io::ErrorKind::InvalidInput, why));
        }
        Format::Planetlab => {
            let start = planetlab_start(path).ok_or_else(|| {
                std::io::Error::new(
                    std::io::ErrorKind::InvalidInput,
                    "a PlanetLab file must be in a folder named after its day (`20110303/`)",
                )
            })?;
            Box::new(planetlab(reader, start, file_name(path)))
        }
    };
    Ok(Input { name, records: wrap(records), progress, size })
}

fn file_stem(path: &Path) -> String {
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let name = name.strip_suffix(".gz").unwrap_or(&name);
    name.rsplit_once('.').map_or(name, |(stem, _)| stem).to_string()
}

fn file_name(path: &Path) -> String {
    path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default()
}

fn detect(path: &Path, head: &[u8]) -> Format {
    let name = file_stem(path);
    let first_line = head.split(|b| *b == b'\n').next().unwrap_or_default();
    let first_line = String::from_utf8_lossy(first_line);
    if name.contains("batch_task") {
        Format::AlibabaBatchTask
    } else if name.contains("server_event") {
        Format::AlibabaServerEvent
    } else if name.contains("task_events") {
        Format::GoogleTaskEvents
    } else if name.contains("task_usage") {
        Format::GoogleTaskUsage
    } else if name.contains("machine_events") {
        Format::GoogleMachineEvents
    } else if first_line.trim_start_matches('\u{feff}').trim() == "timestamp,value" {
        Format::Nab
    } else if file_name(path).trim_end_matches(".gz").ends_with(".lp") {
        Format::Influx
    } else if first_line.starts_with("t_offset_s,step,vm_id") {
        Format::AzureCpu
    } else if planetlab_start(path).is_some()
        && path.extension().is_none()
        && !first_line.is_empty()
        && first_line.trim().bytes().all(|b| b.is_ascii_digit())
    {
        Format::Planetlab
    } else {
        Format::Jsonl
    }
}

fn jsonl<T>(
    reader: Box<dyn BufRead>,
    mut decode: impl FnMut(&[u8]) -> Result<T, DecodeError>,
) -> impl Iterator<Item = Record<T>> {
    let mut line_no = 0u64;
    let mut lines = LineReader::new(reader);
    std::iter::from_fn(move || loop {
        line_no += 1;
        let bytes = match lines.next_line()? {
            Ok(bytes) => bytes,
            Err(e) => {
                return Some(Record {
                    line: line_no,
                    event: Err(DecodeError { field: None, reason: format!("read error: {e}") }),
                })
            }
        };
        let mut bytes = bytes;
        while let [rest @ .., b'\r'] = bytes {
            bytes = rest;
        }
        // UTF-8 is checked by the decoder, which says where it breaks; a blank line is no event
        // and no error.
        let event = decode(bytes);
        if event.is_err() && std::str::from_utf8(bytes).is_ok_and(|t| t.trim().is_empty()) {
            continue;
        }
        return Some(Record { line: line_no, event });
    })
}

/// The lines of a reader, without their `\n`, read a large block at a time and handed out in
/// place: no copy per line, and the end of a line is found by a vectorized search
/// (`BufRead::read_until` searches a word at a time and copies every line out).
pub struct LineReader<R> {
    reader: R,
    buf: Vec<u8>,
    /// The unread part of `buf`.
    start: usize,
    end: usize,
    eof: bool,
}

impl<R: Read> LineReader<R> {
    pub fn new(reader: R) -> Self {
        Self::with_block(reader, 1 << 20)
    }

    /// Reads `block` bytes at a time (at least one).
    pub fn with_block(reader: R, block: usize) -> Self {
        LineReader { reader, buf: vec![0; block.max(1)], start: 0, end: 0, eof: false }
    }

    /// The next line, `None` at the end. The last line needs no `\n`; a line longer than the
    /// block grows it.
    pub fn next_line(&mut self) -> Option<std::io::Result<&[u8]>> {
        loop {
            if let Some(i) = memchr::memchr(b'\n', &self.buf[self.start..self.end]) {
                let line = self.start..self.start + i;
                self.start += i + 1;
                return Some(Ok(&self.buf[line]));
            }
            if self.eof {
                if self.start == self.end {
                    return None;
                }
                let line = self.start..self.end;
                self.start = self.end;
                return Some(Ok(&self.buf[line]));
            }
            // Keep the start of the unfinished line and read more after it.
            self.buf.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
            if self.end == self.buf.len() {
                self.buf.resize(self.buf.len() * 2, 0);
            }
            match self.reader.read(&mut self.buf[self.end..]) {
                Ok(0) => self.eof = true,
                Ok(n) => self.end += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => {
                    // Reported once, and the input ends there: a reader that failed may fail again.
                    self.eof = true;
                    self.start = self.end;
                    return Some(Err(e));
                }
            }
        }
    }
}

/// CSV rows through `row`, with line numbers; `header` skips the first line.
fn csv_records<F>(reader: Box<dyn BufRead>, header: bool, row: F) -> impl Iterator<Item = Record>
where
    F: Fn(&csv::StringRecord) -> Result<Event, DecodeError>,
{
    csv_rows(reader, header, move |r| row(r).map(|e| vec![e]))
}

/// CSV rows through `row`, which makes any number of events of one row, with line numbers.
fn csv_rows<F>(reader: Box<dyn BufRead>, header: bool, row: F) -> impl Iterator<Item = Record>
where
    F: Fn(&csv::StringRecord) -> Result<Vec<Event>, DecodeError>,
{
    let mut rows = csv::ReaderBuilder::new()
        .has_headers(header)
        .flexible(true)
        .trim(csv::Trim::All)
        .from_reader(reader)
        .into_records();
    let mut pending: std::collections::VecDeque<Record> = std::collections::VecDeque::new();
    std::iter::from_fn(move || loop {
        if let Some(record) = pending.pop_front() {
            return Some(record);
        }
        match rows.next()? {
            Ok(r) => {
                let line = r.position().map_or(0, |p| p.line());
                match row(&r) {
                    Ok(events) => pending.extend(events.into_iter().map(|e| Record { line, event: Ok(e) })),
                    Err(e) => return Some(Record { line, event: Err(e) }),
                }
            }
            Err(e) => {
                return Some(Record {
                    line: e.position().map_or(0, |p| p.line()),
                    event: Err(DecodeError { field: None, reason: format!("bad CSV: {e}") }),
                })
            }
        }
    })
}

fn col<'r>(row: &'r csv::StringRecord, i: usize, name: &str) -> Result<&'r str, DecodeError> {
    row.get(i).ok_or_else(|| DecodeError { field: Some(name.into()), reason: format!("missing column {}", i + 1) })
}

fn num(row: &csv::StringRecord, i: usize, name: &str) -> Result<Value, DecodeError> {
    let text = col(row, i, name)?;
    if text.is_empty() {
        return Ok(Value::Null);
    }
    text.parse::<f64>()
        .map(Value::Num)
        .map_err(|_| DecodeError { field: Some(name.into()), reason: format!("`{text}` is not a number") })
}

fn text(row: &csv::StringRecord, i: usize, name: &str) -> Result<Value, DecodeError> {
    let t = col(row, i, name)?;
    Ok(if t.is_empty() { Value::Null } else { Value::str(t) })
}

fn micros(row: &csv::StringRecord, i: usize) -> Result<Millis, DecodeError> {
    let t = col(row, i, "time")?;
    t.parse::<i64>()
        .map(|us| us / 1000)
        .map_err(|_| DecodeError { field: Some("time".into()), reason: format!("`{t}` is not a time in microseconds") })
}

/// NAB file names end in a short hex id (`ec2_cpu_utilization_5f5533`): that is the host and
/// the rest the metric. Other names are both.
fn nab_series(stem: &str, options: &InputOptions) -> (String, String) {
    let (host, name) = match stem.rsplit_once('_') {
        Some((name, id)) if id.len() == 6 && id.chars().all(|c| c.is_ascii_hexdigit()) => {
            (id.to_string(), name.to_string())
        }
        _ => (stem.to_string(), stem.to_string()),
    };
    (options.host.clone().unwrap_or(host), options.metric_name.clone().unwrap_or(name))
}

fn nab_row(row: &csv::StringRecord, host: &str, name: &str) -> Result<Event, DecodeError> {
    let stamp = col(row, 0, "timestamp")?;
    let ts = parse_naive_utc(stamp).ok_or_else(|| DecodeError {
        field: Some("timestamp".into()),
        reason: format!("`{stamp}` is not `YYYY-MM-DD hh:mm:ss`"),
    })?;
    let mut e = Event::new(Stream::Metric, ts);
    e.set("host", Value::str(host)).set("name", Value::str(name)).set("value", num(row, 1, "value")?);
    // NAB's CPU series are CloudWatch's `CPUUtilization`, a percentage.
    if name.ends_with("cpu_utilization") {
        e.set("unit", Value::str("percent"));
    }
    Ok(e)
}

/// `2014-02-14 14:30:00` (optionally with fractional seconds), read as UTC.
pub fn parse_naive_utc(s: &str) -> Option<Millis> {
    let s = s.trim();
    let (date, clock) = s.split_once([' ', 'T'])?;
    vigil_engine::event::parse_time(&format!("{date}T{clock}Z"))
}

/// An Azure V1 reading: seconds from the trace's start (taken as the Unix epoch, as the trace
/// gives no date), the VM, and its average and maximum CPU percentage over five minutes.
fn azure_cpu(row: &csv::StringRecord) -> Result<Vec<Event>, DecodeError> {
    let ts = seconds(row, 0, "t_offset_s")?;
    let vm = text(row, 2, "vm_id")?;
    let mut out = Vec::with_capacity(2);
    for (i, name) in [(3, "avg_cpu"), (4, "max_cpu")] {
        let mut e = Event::new(Stream::Metric, ts);
        e.set("host", vm.clone()).set("name", Value::str(name)).set("value", num(row, i, name)?);
        e.set("unit", Value::str("percent"));
        out.push(e);
    }
    Ok(out)
}

/// The day a PlanetLab file's folder is named after (`20110303`), at midnight UTC.
fn planetlab_start(path: &Path) -> Option<Millis> {
    let day = path.parent()?.file_name()?.to_str()?;
    if day.len() != 8 || !day.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    vigil_engine::event::parse_time(&format!("{}-{}-{}T00:00:00Z", &day[..4], &day[4..6], &day[6..]))
}

/// Line i of a PlanetLab file is the sample at `start + (i - 1) * 5 min`; a blank line is a
/// sample missing.
fn planetlab(reader: Box<dyn BufRead>, start: Millis, host: String) -> impl Iterator<Item = Record> {
    let host = Value::str(&host);
    reader.split(b'\n').enumerate().filter_map(move |(i, line)| {
        let line_no = i as u64 + 1;
        let event = match line {
            Err(e) => Err(DecodeError { field: None, reason: format!("cannot read: {e}") }),
            Ok(bytes) => {
                let text = String::from_utf8_lossy(&bytes);
                let text = text.trim();
                if text.is_empty() {
                    return None;
                }
                match text.parse::<f64>() {
                    Ok(v) if v.is_finite() => {
                        let mut e = Event::new(Stream::Metric, start + i as Millis * 300_000);
                        e.set("host", host.clone())
                            .set("name", Value::str("cpu_utilization"))
                            .set("unit", Value::str("percent"))
                            .set("value", Value::Num(v));
                        Ok(e)
                    }
                    _ => Err(DecodeError {
                        field: Some("cpu_utilization".into()),
                        reason: format!("`{text}` is not a number"),
                    }),
                }
            }
        };
        Some(Record { line: line_no, event })
    })
}

const GOOGLE_TASK_TYPES: [&str; 9] =
    ["SUBMIT", "SCHEDULE", "EVICT", "FAIL", "FINISH", "KILL", "LOST", "UPDATE_PENDING", "UPDATE_RUNNING"];

fn google_type(row: &csv::StringRecord, i: usize, names: &[&str]) -> Result<Value, DecodeError> {
    let t = col(row, i, "event type")?;
    t.parse::<usize>().ok().and_then(|n| names.get(n)).map(|name| Value::str(name)).ok_or_else(|| DecodeError {
        field: Some("event type".into()),
        reason: format!("`{t}` is not a known event type"),
    })
}

fn google_task_event(row: &csv::StringRecord) -> Result<Event, DecodeError> {
    let mut e = Event::new(Stream::TaskEvent, micros(row, 0)?);
    e.set("job_id", text(row, 2, "job ID")?)
        .set("task_index", num(row, 3, "task index")?)
        .set("machine_id", text(row, 4, "machine ID")?)
        .set("type", google_type(row, 5, &GOOGLE_TASK_TYPES)?)
        .set("user", text(row, 6, "user")?)
        .set("sched_class", num(row, 7, "scheduling class")?)
        .set("priority", num(row, 8, "priority")?)
        .set("cpu_request", num(row, 9, "CPU request")?)
        .set("mem_request", num(row, 10, "memory request")?);
    Ok(e)
}

/// A usage sample is stamped with the end of its measurement interval, when it is known.
fn google_task_usage(row: &csv::StringRecord) -> Result<Event, DecodeError> {
    let mut e = Event::new(Stream::TaskUsage, micros(row, 1)?);
    e.set("job_id", text(row, 2, "job ID")?)
        .set("task_index", num(row, 3, "task index")?)
        .set("machine_id", text(row, 4, "machine ID")?)
        .set("cpu", num(row, 5, "CPU rate")?)
        .set("mem", num(row, 6, "canonical memory usage")?)
        .set("max_mem", num(row, 10, "maximum memory usage")?)
        .set("disk_io", num(row, 11, "disk I/O time")?)
        .set("max_cpu", num(row, 13, "maximum CPU rate")?)
        .set("cpi", num(row, 15, "cycles per instruction")?);
    Ok(e)
}

fn google_machine_event(row: &csv::StringRecord) -> Result<Event, DecodeError> {
    let mut e = Event::new(Stream::MachineEvent, micros(row, 0)?);
    e.set("machine_id", text(row, 1, "machine ID")?)
        .set("type", google_type(row, 2, &["ADD", "REMOVE", "UPDATE"])?)
        .set("cpus", num(row, 4, "CPUs")?)
        .set("memory", num(row, 5, "memory")?);
    Ok(e)
}

/// Alibaba 2017 times are seconds from the start of the trace; they are read as seconds from
/// the Unix epoch, so the trace starts at 1970-01-01.
fn seconds(row: &csv::StringRecord, i: usize, name: &str) -> Result<Millis, DecodeError> {
    let t = col(row, i, name)?;
    t.parse::<f64>()
        .ok()
        .filter(|s| s.is_finite())
        .map(|s| (s * 1000.0) as Millis)
        .ok_or_else(|| DecodeError { field: Some(name.into()), reason: format!("`{t}` is not a time in seconds") })
}

fn alibaba_server_event(row: &csv::StringRecord) -> Result<Event, DecodeError> {
    let mut e = Event::new(Stream::MachineEvent, seconds(row, 0, "timestamp")?);
    let kind = col(row, 2, "event type")?.to_ascii_uppercase();
    e.set("machine_id", text(row, 1, "machine id")?)
        .set("type", Value::str(&kind))
        .set("detail", text(row, 3, "detail")?)
        .set("cpus", num(row, 4, "cpus")?)
        .set("memory", num(row, 5, "memory")?);
    Ok(e)
}

/// Each batch_task row is a task's life: SUBMIT at creation, SCHEDULE right after unless it is
/// still Waiting, and FINISH (Terminated) or FAIL (Failed) at its end time. Rows are not in time
/// order, so the events of the file are read whole and sorted; a bad row is reported at its line.
fn alibaba_batch_task(reader: Box<dyn BufRead>) -> impl Iterator<Item = Record> {
    let mut out: Vec<Record> = Vec::new();
    let rows = csv::ReaderBuilder::new().has_headers(true).flexible(true).trim(csv::Trim::All).from_reader(reader);
    for result in rows.into_records() {
        match result {
            Ok(row) => {
                let line = row.position().map_or(0, |p| p.line());
                match batch_task_events(&row) {
                    Ok(events) => out.extend(events.into_iter().map(|e| Record { line, event: Ok(e) })),
                    Err(e) => out.push(Record { line, event: Err(e) }),
                }
            }
            Err(e) => out.push(Record {
                line: e.position().map_or(0, |p| p.line()),
                event: Err(DecodeError { field: None, reason: format!("bad CSV: {e}") }),
            }),
        }
    }
    // Errors sort by their line, events by time: errors carry no time, so they come first.
    out.sort_by_key(|r| (r.event.as_ref().map_or(Millis::MIN, |e| e.ts), r.line));
    out.into_iter()
}

fn batch_task_events(row: &csv::StringRecord) -> Result<Vec<Event>, DecodeError> {
    let created = seconds(row, 0, "task_create_time")?;
    let status = col(row, 5, "status")?;
    let task = |ts: Millis, kind: &str| -> Result<Event, DecodeError> {
        let mut e = Event::new(Stream::TaskEvent, ts);
        e.set("job_id", text(row, 2, "job_id")?)
            .set("task_index", num(row, 3, "task_id")?)
            .set("type", Value::str(kind))
            .set("cpu_request", num(row, 6, "cpus_requested")?.as_f64().map_or(Value::Null, |c| Value::Num(c / 100.0)))
            .set("mem_request", num(row, 7, "memory_requested")?);
        Ok(e)
    };
    // The trace has whole seconds and one time for creation; SCHEDULE goes 1 ms after SUBMIT
    // and the end 1 ms after that at the earliest, so the steps of a life keep their order.
    let mut events = vec![task(created, "SUBMIT")?];
    if status != "Waiting" {
        events.push(task(created + 1, "SCHEDULE")?);
    }
    let end = match status {
        "Terminated" => Some("FINISH"),
        "Failed" => Some("FAIL"),
        "Running" | "Waiting" => None,
        other => {
            return Err(DecodeError { field: Some("status".into()), reason: format!("unknown task status `{other}`") });
        }
    };
    if let Some(kind) = end {
        events.push(task(seconds(row, 1, "task_end_time")?.max(created + 2), kind)?);
    }
    Ok(events)
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(super) fn read(name: &str, content: &str, format: Format) -> Vec<Record> {
        let dir = std::env::temp_dir().join(format!("vigil-input-{}-{name}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let path = dir.join(name);
        std::fs::create_dir_all(path.parent().expect("parent")).expect("folder");
        std::fs::write(&path, content).expect("write");
        let records = open(&path, format, &InputOptions::default()).expect("opens").records.collect();
        std::fs::remove_dir_all(&dir).ok();
        records
    }

    #[test]
    fn azure_readings_are_two_series_per_vm() {
        let csv = "t_offset_s,step,vm_id,avg_cpu,max_cpu\n0,1,1023683,9.6,43.0\n300,2,1023683,oops,50\n";
        let r = read("azure.csv", csv, Format::Auto);
        assert_eq!(r.len(), 3, "{r:?}");
        let e = r[1].event.as_ref().expect("event");
        assert_eq!((e.ts, e.value(0), e.value(1)), (0, Value::str("1023683"), Value::str("max_cpu")));
        assert_eq!(e.value(2), Value::Num(43.0));
        let bad = r[2].event.as_ref().expect_err("a bad number");
        assert_eq!((r[2].line, bad.field.as_deref()), (3, Some("avg_cpu")));
    }

    #[test]
    fn planetlab_samples_are_five_minutes_apart_from_the_folders_day() {
        let r = read("20110303/146-179_surfsnel host", "24\n34\n\n7\n", Format::Auto);
        let events: Vec<&Event> = r.iter().map(|r| r.event.as_ref().expect("event")).collect();
        let day = vigil_engine::event::parse_time("2011-03-03T00:00:00Z").expect("day");
        assert_eq!(events.iter().map(|e| e.ts - day).collect::<Vec<_>>(), [0, 300_000, 900_000]);
        assert_eq!(events[0].value(0), Value::str("146-179_surfsnel host"));
        assert_eq!(events[2].value(2), Value::Num(7.0));
    }

    #[test]
    fn nab_series_from_the_file_name() {
        let r = read(
            "ec2_cpu_utilization_5f5533.csv",
            "timestamp,value\n2014-02-14 14:30:00,0.132\nnot a time,1\n",
            Format::Auto,
        );
        let e = r[0].event.as_ref().expect("first row is valid");
        assert_eq!(
            (e.get("host"), e.get("name"), e.get("value")),
            (Value::str("5f5533"), Value::str("ec2_cpu_utilization"), Value::Num(0.132))
        );
        assert_eq!(vigil_engine::event::format_time(e.ts), "2014-02-14T14:30:00.000Z");
        assert_eq!(r[1].line, 3);
        assert_eq!(r[1].event.as_ref().expect_err("bad time").field.as_deref(), Some("timestamp"));
    }

    #[test]
    fn alibaba_batch_task_becomes_a_sorted_task_life() {
        let csv = "task_create_time, task_end_time, job_id, task_id,number_of_instances, status, cpus,mem\n\
                   100,160,3,4,1,Failed,50,0.1\n50,70,3,5,1,Terminated,100,0.2\n90,95,4,1,1,Waiting,,\n";
        let r = read("batch_task.csv", csv, Format::Auto);
        let kinds: Vec<(Millis, String)> = r
            .iter()
            .map(|r| r.event.as_ref().expect("valid"))
            .map(|e| (e.ts / 1000, e.get("type").to_text()))
            .collect();
        let want = [
            (50, "SCHEDULE"),
            (50, "SUBMIT"),
            (70, "FINISH"),
            (90, "SUBMIT"),
            (100, "SCHEDULE"),
            (100, "SUBMIT"),
            (160, "FAIL"),
        ];
        let mut got = kinds.clone();
        got.sort();
        assert_eq!(got, want.iter().map(|(t, k)| (*t, k.to_string())).collect::<Vec<_>>());
        assert!(kinds.windows(2).all(|w| w[0].0 <= w[1].0), "sorted by time: {kinds:?}");
        let fail = r
            .iter()
            .filter_map(|r| r.event.as_ref().ok())
            .find(|e| e.get("type") == Value::str("FAIL"))
            .expect("a FAIL");
        assert_eq!(fail.get("cpu_request"), Value::Num(0.5));
    }

    #[test]
    fn lines_come_whole_across_blocks_of_any_size() {
        let text = "first\n\nsecond line, longer than a block\nlast without a newline";
        let expected: Vec<&str> = text.split('\n').collect();
        for block in [1, 2, 3, 7, 64] {
            let mut lines = LineReader::with_block(text.as_bytes(), block);
            let mut got = Vec::new();
            while let Some(line) = lines.next_line() {
                got.push(String::from_utf8(line.expect("in memory").to_vec()).expect("UTF-8"));
            }
            assert_eq!(got, expected, "block of {block}");
        }
        let mut trailing = LineReader::with_block(&b"a\nb\n"[..], 2);
        assert_eq!(trailing.next_line().map(|l| l.ok().map(<[u8]>::to_vec)), Some(Some(b"a".to_vec())));
        assert_eq!(trailing.next_line().map(|l| l.ok().map(<[u8]>::to_vec)), Some(Some(b"b".to_vec())));
        assert!(trailing.next_line().is_none(), "no empty line after the last newline");
    }

    #[test]
    fn jsonl_reports_bad_lines_with_their_number() {
        let r = read("events.jsonl", "{\"stream\":\"metric\",\"ts\":1}\n\n{oops\n", Format::Auto);
        assert_eq!(r.len(), 2);
        assert!(r[0].event.is_ok());
        assert_eq!(r[1].line, 3);
    }

    #[test]
    fn google_task_events_use_microseconds_and_type_codes() {
        let r =
            read("part-00000-of-00500.task_events.csv", "5000000,,6251,0,m7,3,alice,2,9,0.1,0.2,0,0\n", Format::Auto);
        let e = r[0].event.as_ref().expect("valid");
        assert_eq!(e.ts, 5000);
        assert_eq!(e.event_type(), Some("FAIL"));
        assert_eq!(e.get("machine_id"), Value::str("m7"));
        assert_eq!(e.get("priority"), Value::Num(9.0));
    }
}
