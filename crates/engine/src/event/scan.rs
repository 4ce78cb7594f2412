//! The fast path of [`decode`](super::decode): flat event objects, scanned byte by byte.
//!
//! Events are flat objects of short strings and numbers, and serde's visitor interface costs
//! more than the scanning itself on them (a call per key and per value, each through a seed).
//! This scanner takes the plain case only: the stream known from the first key (or the
//! default stream), keys and strings without escapes, numbers, `true`, `false`, `null`, no
//! nested value, no key given twice. On anything else it gives up and the caller decodes the
//! line with serde_json, which also words every error.
//!
//! What it accepts it turns into the same event as serde_json would: values that are not a
//! plain number for a number field or a plain string for a text field go through the same
//! [`convert`]; integers are told from floats by JSON's grammar, as serde_json does; and floats
//! are correctly rounded, as serde_json's `float_roundtrip` makes them. A test compares both
//! paths on mutated lines.
//!
//! Most lines are not scanned key by key: a line with the [`Shape`] of one of the last lines
//! scanned in full (the same bytes between its values) is read value by value. The scanner
//! works on bytes and checks UTF-8 only inside strings; everything else it accepts is ASCII.
//!
//! A line of a known shape can also be judged without building its event ([`scan_gated`]): it
//! is checked as it would be read, but only the numbers the rules' [`EventGate`] compares are
//! converted, and no string is copied.
//!
//! What the scanner remembers of earlier lines ([`ScanMemory`]) and the events it reads into
//! ([`EventPool`]) belong to whoever decodes: nothing is kept behind the caller's back.

use super::json::{convert, has_required, key_of, stream_of, stream_position, ts_of, Key, Raw};
use super::{Decoded, Event, EventGate, EventPool, Millis, Stream, Value, MAX_STRING};
use std::borrow::Cow;
use std::sync::Arc;
use vigil_lang::schema::{Catalog, Type};

/// What a decoder remembers of the lines it read: the keys of the last line scanned in full,
/// and the shapes of the last lines, newest first.
#[derive(Default)]
pub struct ScanMemory {
    last_keys: Vec<(Box<[u8]>, Key)>,
    shapes: Vec<Shape>,
}

/// The event on `line`, or `None` when the line needs the full decoder.
pub(super) fn scan(
    line: &[u8],
    default_stream: Option<Stream>,
    catalog: &Catalog,
    memory: &mut ScanMemory,
) -> Option<Event> {
    scan_as(
        line,
        default_stream,
        catalog,
        memory,
        |shape| {
            let mut event = Event::new(shape.stream, 0);
            shape.fill(line, default_stream, &mut event).map(|()| event)
        },
        |event| event,
    )
}

/// [`scan`], except that a line of a known shape whose event `gate` shows no rule takes comes
/// back as its time alone. The line is checked as [`scan`] checks it, so a line passed so is
/// one [`scan`] would take, but no value is built. An event is read into one of `pool` when it
/// has one.
pub(super) fn scan_gated<G: EventGate>(
    line: &[u8],
    default_stream: Option<Stream>,
    catalog: &Catalog,
    gate: &G,
    memory: &mut ScanMemory,
    pool: &mut EventPool,
) -> Option<Decoded> {
    let known = |shape: &Shape| match shape.time_only(line, default_stream, gate) {
        Some(ts) => Some(Decoded::Time(ts)),
        None => shape.fill_spare(line, default_stream, &mut pool.spares).map(Decoded::Event),
    };
    scan_as(line, default_stream, catalog, memory, known, |event| Decoded::Event(Arc::new(event)))
}

/// A line read with the first remembered shape it has (`known`), or else scanned in full
/// (the event handed to `new`) and its shape remembered.
fn scan_as<T>(
    line: &[u8],
    default_stream: Option<Stream>,
    catalog: &Catalog,
    memory: &mut ScanMemory,
    known: impl FnMut(&Shape) -> Option<T>,
    new: impl FnOnce(Event) -> T,
) -> Option<T> {
    let ScanMemory { last_keys, shapes } = memory;
    if let Some(found) = shapes.iter().find_map(known) {
        return Some(found);
    }
    let (event, shape) = scan_with(line, default_stream, catalog, last_keys)?;
    shapes.insert(0, shape);
    shapes.truncate(SHAPES);
    Some(new(event))
}

impl Shape {
    /// The time of the event on `line` when it has this shape and `gate` shows that no rule
    /// takes it; `None` when it needs decoding.
    fn time_only<G: EventGate>(&self, line: &[u8], default_stream: Option<Stream>, gate: &G) -> Option<Millis> {
        // A stream with required fields has its events built, which checks them.
        if self.required != 0 || !gate.judges(self.stream) {
            return None;
        }
        // The numbers the gate reads, by field position. A line with one past the 16th is
        // built instead (`get_mut` below fails): Vigil's own streams have fewer, and a wider
        // array would be cleared for every line.
        let read = gate.reads(self.stream);
        // NaN for a missing field: comparisons with both are false.
        let mut numbers = [f64::NAN; 16];
        let ts = self.read(line, default_stream, |s, position, name, ty| {
            let wanted = read & (1 << position) != 0;
            match (ty, s.peek()?) {
                (Type::Str, b'"') => return s.skip_string(MAX_STRING),
                (Type::Number, b'-' | b'0'..=b'9') if !wanted && s.skip_plain_number().is_some() => return Some(()),
                (Type::Number, b'-' | b'0'..=b'9') if wanted => {
                    if let Some(n) = s.plain_number() {
                        *numbers.get_mut(position)? = n;
                        return Some(());
                    }
                }
                _ => {}
            }
            // What the shortcuts above do not take, read as `scan` reads it.
            if let Value::Num(n) = s.typed(name, ty)? {
                *numbers.get_mut(position)? = n;
            }
            Some(())
        })?;
        gate.refuses(self.stream, |i| numbers.get(i).copied()).then_some(ts)
    }
}

/// How many shapes the scanner remembers: one per stream, for input that mixes them.
const SHAPES: usize = 4;

/// A line's shape: the bytes between its values, and what each value is. A producer writes
/// every event of a stream with the same keys in the same order and spacing, so a line whose
/// bytes between values are those of an earlier line has that line's keys in the same places:
/// each key costs one comparison of a few words, and no key is looked up. The stream's name, a
/// string that does not change, is part of the bytes before the first value.
struct Shape {
    default_stream: Option<Stream>,
    stream: Stream,
    /// `gaps[i]` is what comes before value `i`; the last gap ends the line.
    gaps: Vec<Box<[u8]>>,
    slots: Vec<Slot>,
    /// Positions of the stream's fields that lines of this shape do not have.
    unread: Vec<usize>,
    /// The stream's required fields, as bits ([`Stream::required`]), kept here so that a line
    /// of a known shape does not look its stream up.
    required: u64,
}

/// What a value of a shape is.
#[derive(Clone, Copy)]
enum Slot {
    Ts,
    Field { position: usize, name: &'static str, ty: Type },
    Ignored,
}

impl Shape {
    /// Reads the event on `line` into `event`, an event of this shape's stream whose fields
    /// lines of this shape do not have are `Null`, if the line has this shape; `None` if not,
    /// or if a value needs the full scanner or serde_json, with `event` then partly filled.
    fn fill(&self, line: &[u8], default_stream: Option<Stream>, event: &mut Event) -> Option<()> {
        event.ts = self.read(line, default_stream, |s, position, name, ty| {
            let value = s.typed(name, ty)?;
            // Written over without a call to drop what was there when it owns nothing (the
            // `Null` of a new event, or a number or short text of a spare's last line).
            std::mem::replace(&mut event.fields[position], value).discard();
            Some(())
        })?;
        // A required field left null is refused, in serde_json's words.
        if self.required != 0 {
            has_required(event).ok()?;
        }
        Some(())
    }

    /// [`Shape::fill`] into a spare event, or a new one when there is none; a spare the line
    /// does not fit goes back.
    fn fill_spare(
        &self,
        line: &[u8],
        default_stream: Option<Stream>,
        spares: &mut Vec<Arc<Event>>,
    ) -> Option<Arc<Event>> {
        let mut shared = spares.pop().unwrap_or_else(|| Arc::new(Event::new(self.stream, 0)));
        // Spares are held by nothing else, so this is the event itself.
        let Some(event) = Arc::get_mut(&mut shared) else {
            let mut event = Event::new(self.stream, 0);
            return self.fill(line, default_stream, &mut event).map(|()| Arc::new(event));
        };
        // The spare still has the values of its last line. Those of the fields this shape
        // reads are written over (and dropped) as they are read; the others are cleared here.
        if event.stream == self.stream {
            for &p in &self.unread {
                std::mem::replace(&mut event.fields[p], Value::Null).discard();
            }
        } else {
            event.clear(self.stream);
        }
        if self.fill(line, default_stream, event).is_some() {
            return Some(shared);
        }
        spares.push(shared);
        None
    }

    /// Reads `line` with this shape, handing each field's value to `field` (with the field's
    /// position, name and type) to read; the event's time, or `None` where the line differs.
    #[inline(always)]
    fn read(
        &self,
        line: &[u8],
        default_stream: Option<Stream>,
        mut field: impl FnMut(&mut Scanner<'_>, usize, &'static str, Type) -> Option<()>,
    ) -> Option<Millis> {
        if default_stream != self.default_stream {
            return None;
        }
        let mut no_keys = Vec::new();
        let mut s = Scanner::new(line, &mut no_keys);
        let mut ts = None;
        for (gap, slot) in self.gaps.iter().zip(&self.slots) {
            s.gap(gap)?;
            match *slot {
                // A plain number reads as `ts_of` would read its integer or float.
                Slot::Ts => match s.plain_millis() {
                    Some(millis) => ts = Some(millis),
                    None => {
                        let raw = s.plain_number().map_or_else(|| s.value(), |n| Some(Raw::Float(n)))?;
                        ts = Some(ts_of(Some(raw)).ok()?);
                    }
                },
                Slot::Field { position, name, ty } => field(&mut s, position, name, ty)?,
                Slot::Ignored => {
                    s.value()?;
                }
            }
        }
        s.gap(self.gaps.last()?)?;
        (s.at == s.bytes.len()).then_some(())?;
        ts
    }
}

/// Whether `a` and `b`, of the same length, hold the same bytes: a word at a time (the gaps
/// between values are short, and a call to `memcmp` would cost more than comparing them).
fn same(a: &[u8], b: &[u8]) -> bool {
    fn word(bytes: &[u8], at: usize) -> u64 {
        let mut w = [0u8; 8];
        w.copy_from_slice(&bytes[at..at + 8]);
        u64::from_ne_bytes(w)
    }
    fn half(bytes: &[u8], at: usize) -> u32 {
        let mut w = [0u8; 4];
        w.copy_from_slice(&bytes[at..at + 4]);
        u32::from_ne_bytes(w)
    }
    let n = a.len().min(b.len());
    if n < 4 {
        return a[..n].iter().zip(&b[..n]).all(|(x, y)| x == y);
    }
    if n < 8 {
        // Two half words, overlapping when the length is not 8.
        return half(a, 0) == half(b, 0) && half(a, n - 4) == half(b, n - 4);
    }
    let mut at = 0;
    while at + 8 < n {
        if word(a, at) != word(b, at) {
            return false;
        }
        at += 8;
    }
    // The last word, overlapping the one before when the length is not a multiple of 8.
    word(a, n - 8) == word(b, n - 8)
}

/// The full scan of a line: its event, and its shape when later lines can reuse it.
fn scan_with(
    line: &[u8],
    default_stream: Option<Stream>,
    catalog: &Catalog,
    last_keys: &mut Vec<(Box<[u8]>, Key)>,
) -> Option<(Event, Shape)> {
    let mut s = Scanner::new(line, last_keys);
    s.ws();
    s.eat(b'{')?;
    s.ws();
    let mut key = Some(s.key()?);
    let stream = match key {
        Some(Key::Stream) => {
            let stream = stream_of(Some(s.value()?), None, catalog).ok()?;
            key = s.after_value()?;
            stream
        }
        _ => default_stream?,
    };
    let mut event = Event::new(stream, 0);
    let mut ts = None;
    // Keys seen so far: `ts`, then the fields of the stream by position.
    let mut seen = 0u128;
    // Where each value starts and ends, and what it is, for the line's shape.
    let mut values: Vec<(usize, usize, Slot)> = Vec::with_capacity(stream.fields().len() + 1);
    while let Some(k) = key {
        let start = s.at;
        let slot = match k {
            // A key given twice is refused; serde_json's path says so.
            Key::Stream => return None,
            Key::Ts => {
                once(&mut seen, 1)?;
                ts = Some(s.value()?);
                Slot::Ts
            }
            Key::Field(g) => match stream_position(stream, g) {
                Some(p) => {
                    once(&mut seen, 2 << p)?;
                    let (name, ty) = stream.fields()[p];
                    event.fields[p] = s.typed(name, ty)?;
                    Slot::Field { position: p, name, ty }
                }
                // Another stream's field: not read.
                None => {
                    s.value()?;
                    Slot::Ignored
                }
            },
            Key::Other => {
                s.value()?;
                Slot::Ignored
            }
        };
        values.push((start, s.at, slot));
        key = s.after_value()?;
    }
    event.ts = ts_of(ts).ok()?;
    has_required(&event).ok()?;
    let mut gaps = Vec::with_capacity(values.len() + 1);
    let mut from = 0;
    for &(start, end, _) in &values {
        gaps.push(line[from..start].into());
        from = end;
    }
    gaps.push(line[from..].into());
    let slots: Vec<Slot> = values.into_iter().map(|(_, _, slot)| slot).collect();
    let read = |p: usize| slots.iter().any(|slot| matches!(slot, Slot::Field { position, .. } if *position == p));
    let unread = (0..stream.fields().len()).filter(|&p| !read(p)).collect();
    let shape = Shape { default_stream, stream, gaps, slots, unread, required: stream.required() };
    Some((event, shape))
}

/// Marks a key as seen; a key given twice is left to serde_json's path.
fn once(seen: &mut u128, bit: u128) -> Option<()> {
    if *seen & bit != 0 {
        return None;
    }
    *seen |= bit;
    Some(())
}

/// Bytes that end the plain part of a string: the quote, a backslash, control characters.
static STRING_END: [bool; 256] = {
    let mut table = [false; 256];
    let mut b = 0;
    while b < 0x20 {
        table[b] = true;
        b += 1;
    }
    table[b'"' as usize] = true;
    table[b'\\' as usize] = true;
    table
};

/// Powers of ten that an `f64` holds exactly.
const POW10: [f64; 23] = [
    1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11, 1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19, 1e20,
    1e21, 1e22,
];

struct Scanner<'a> {
    bytes: &'a [u8],
    at: usize,
    /// The keys of the previous line, in order: a producer writes its keys in the same order
    /// every time, so each key is first compared whole with the one at its place last time.
    last_keys: &'a mut Vec<(Box<[u8]>, Key)>,
    /// Keys read so far on this line.
    nth_key: usize,
}

impl<'a> Scanner<'a> {
    fn new(line: &'a [u8], last_keys: &'a mut Vec<(Box<[u8]>, Key)>) -> Self {
        Scanner { bytes: line, at: 0, last_keys, nth_key: 0 }
    }

    /// The bytes of a shape's gap, here.
    fn gap(&mut self, gap: &[u8]) -> Option<()> {
        let end = self.at + gap.len();
        let here = self.bytes.get(self.at..end)?;
        same(here, gap).then(|| self.at = end)
    }

    fn peek(&self) -> Option<u8> {
        self.bytes.get(self.at).copied()
    }

    fn eat(&mut self, want: u8) -> Option<()> {
        (self.peek()? == want).then(|| self.at += 1)
    }

    /// JSON's whitespace.
    fn ws(&mut self) {
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = self.peek() {
            self.at += 1;
        }
    }

    /// A key and its colon.
    fn key(&mut self) -> Option<Key> {
        let n = self.nth_key;
        self.nth_key += 1;
        // The quoted key as it stood at this place on the previous line; a cached key has no
        // quote or backslash in it, so equal bytes are the same key.
        let quoted = |text: &[u8]| {
            let end = self.at + text.len() + 2;
            let here = self.bytes.get(self.at..end)?;
            (here[0] == b'"' && &here[1..end - self.at - 1] == text && here[end - self.at - 1] == b'"').then_some(end)
        };
        let key = match self.last_keys.get(n).and_then(|(text, key)| Some((quoted(text)?, *key))) {
            Some((end, key)) => {
                self.at = end;
                key
            }
            None => {
                let text = self.string()?;
                let key = key_of(text);
                self.last_keys.truncate(n);
                self.last_keys.push((text.as_bytes().into(), key));
                key
            }
        };
        self.ws();
        self.eat(b':')?;
        self.ws();
        Some(key)
    }

    /// After a value: the next key, or `None` at the end of the object, which must end the line.
    fn after_value(&mut self) -> Option<Option<Key>> {
        self.ws();
        match self.peek()? {
            b',' => {
                self.at += 1;
                self.ws();
                Some(Some(self.key()?))
            }
            b'}' => {
                self.at += 1;
                self.ws();
                (self.at == self.bytes.len()).then_some(None)
            }
            _ => None,
        }
    }

    /// A string without escapes or control characters, borrowed from the line.
    fn string(&mut self) -> Option<&'a str> {
        let (start, end, ascii) = self.plain_string()?;
        let bytes = &self.bytes[start..end];
        if ascii {
            // SAFETY: every byte is below 0x80 (`plain_string` ORed them all together), and a
            // run of ASCII bytes is valid UTF-8. Most strings of events are short ASCII names
            // (`m17`, `j3`), and the call to `from_utf8` cost about as much as reading them.
            return Some(unsafe { std::str::from_utf8_unchecked(bytes) });
        }
        // Checked here, string by string: the rest of a line the scanner takes is ASCII it
        // has matched, so a line it accepts is valid UTF-8 without a pass over the whole line.
        std::str::from_utf8(bytes).ok()
    }

    /// Passes over a string [`Scanner::string`] would take, of at most `most` bytes, without
    /// borrowing it: UTF-8 is checked only when a byte is not ASCII.
    fn skip_string(&mut self, most: usize) -> Option<()> {
        let (start, end, ascii) = self.plain_string()?;
        (end - start <= most && (ascii || std::str::from_utf8(&self.bytes[start..end]).is_ok())).then_some(())
    }

    /// Passes over a string without escapes or control characters: where its text starts and
    /// ends, and whether it is all ASCII.
    fn plain_string(&mut self) -> Option<(usize, usize, bool)> {
        self.eat(b'"')?;
        let start = self.at;
        let mut end = start;
        let mut seen = 0u8;
        while let Some(&b) = self.bytes.get(end) {
            if STRING_END[b as usize] {
                break;
            }
            seen |= b;
            end += 1;
        }
        if self.bytes.get(end) != Some(&b'"') {
            return None;
        }
        self.at = end + 1;
        Some((start, end, seen < 0x80))
    }

    /// A field's value, decoded for its type.
    fn typed(&mut self, name: &str, ty: Type) -> Option<Value> {
        match (ty, self.peek()?) {
            (Type::Number, b'-' | b'0'..=b'9') => match self.plain_number() {
                Some(n) => Some(Value::Num(n)),
                None => self.number()?.as_f64().map(Value::Num),
            },
            (Type::Str, b'"') => {
                let s = self.string()?;
                (s.len() <= MAX_STRING).then(|| Value::str(s))
            }
            _ => convert(name, ty, self.value()?).ok(),
        }
    }

    fn value(&mut self) -> Option<Raw<'a>> {
        match self.peek()? {
            b'"' => Some(Raw::Str(Cow::Borrowed(self.string()?))),
            b't' => self.literal(b"true", Raw::Bool(true)),
            b'f' => self.literal(b"false", Raw::Bool(false)),
            b'n' => self.literal(b"null", Raw::Null),
            b'-' | b'0'..=b'9' => self.number(),
            _ => None,
        }
    }

    fn literal(&mut self, word: &[u8], value: Raw<'a>) -> Option<Raw<'a>> {
        let end = self.at + word.len();
        (self.bytes.get(self.at..end)? == word).then(|| {
            self.at = end;
            value
        })
    }

    /// Digits from here, appended to `acc`; how many there were. `acc` is exact while the
    /// caller has read at most 19 digits into it.
    fn digits(&mut self, acc: &mut u64) -> usize {
        let start = self.at;
        while let Some(d @ b'0'..=b'9') = self.bytes.get(self.at).copied() {
            *acc = acc.wrapping_mul(10).wrapping_add(u64::from(d - b'0'));
            self.at += 1;
        }
        self.at - start
    }

    /// The common number, `-?[0-9]+(.[0-9]+)?` of at most 19 digits, as [`number`] would read
    /// it, in one pass; `None`, with nothing read, for anything else (an exponent, a leading
    /// zero, `-0`, more digits), which [`number`] then reads or refuses.
    fn plain_number(&mut self) -> Option<f64> {
        let (at, mantissa, frac_digits, negative) = self.plain()?;
        if mantissa > 1 << 53 {
            return None;
        }
        let n = if frac_digits == 0 {
            // An integer, as `number` reads it: -0 is its float, and left to it.
            if negative && mantissa == 0 {
                return None;
            }
            mantissa as f64
        } else {
            // Clinger's fast path, exact as in `number`.
            mantissa as f64 / *POW10.get(frac_digits)?
        };
        self.at = at;
        Some(if negative { -n } else { n })
    }

    /// Epoch milliseconds written as a plain integer, as [`ts_of`] reads them: `None`, with
    /// nothing read, for anything else.
    fn plain_millis(&mut self) -> Option<Millis> {
        self.thirteen_digits().or_else(|| self.plain_integer_millis())
    }

    /// [`Scanner::plain_millis`] by the number reader's digit loop, for any plain integer.
    fn plain_integer_millis(&mut self) -> Option<Millis> {
        let (at, mantissa, frac_digits, negative) = self.plain()?;
        // `ts_of` takes a float under 9e15 (and the integer is exact there); `-0` is 0.
        if frac_digits > 0 || mantissa >= 9_000_000_000_000_000 {
            return None;
        }
        self.at = at;
        Some(if negative { -(mantissa as i64) } else { mantissa as i64 })
    }

    /// The common time, epoch milliseconds of this era: thirteen digits, not starting with 0,
    /// followed by a byte that ends the number (not a digit, `.`, `e` or `E`). The first eight
    /// digits are read as one word (the number reader's digit loop costs about seven
    /// instructions a digit, and every event has a time). `None`, with nothing read, otherwise.
    fn thirteen_digits(&mut self) -> Option<Millis> {
        let bytes = self.bytes.get(self.at..self.at + 14)?;
        if bytes[0] == b'0' || matches!(bytes[13], b'0'..=b'9' | b'.' | b'e' | b'E') {
            return None;
        }
        let mut word = [0u8; 8];
        word.copy_from_slice(&bytes[..8]);
        let w = u64::from_le_bytes(word);
        // Every byte is an ASCII digit: its high nibble is 3, and adding 6 keeps it 3.
        let high = 0xF0F0_F0F0_F0F0_F0F0;
        if (w & high) | ((w.wrapping_add(0x0606_0606_0606_0606) & high) >> 4) != 0x3333_3333_3333_3333 {
            return None;
        }
        // Pairs of digits, then fours, then eight (the first digit is the lowest byte).
        let w = (w & 0x0F0F_0F0F_0F0F_0F0F).wrapping_mul(2561) >> 8;
        let w = (w & 0x00FF_00FF_00FF_00FF).wrapping_mul(6_553_601) >> 16;
        let mut n = (w & 0x0000_FFFF_0000_FFFF).wrapping_mul(42_949_672_960_001) >> 32;
        for &b in &bytes[8..13] {
            let d = b.wrapping_sub(b'0');
            if d > 9 {
                return None;
            }
            n = n * 10 + u64::from(d);
        }
        self.at += 13;
        Some(n as Millis)
    }

    /// Passes over a plain number (see [`Scanner::plain_number`]) without converting it: any
    /// such number is a finite float. `None`, with nothing read, for any other number.
    fn skip_plain_number(&mut self) -> Option<()> {
        self.at = self.plain()?.0;
        Some(())
    }

    /// The plain number here: where it ends, its digits (at most 19, as one integer), how many
    /// come after the point, and its sign; `None` if the number here is not plain.
    fn plain(&self) -> Option<(usize, u64, usize, bool)> {
        let bytes = self.bytes;
        let mut at = self.at;
        let negative = bytes.get(at) == Some(&b'-');
        at += usize::from(negative);
        let int_start = at;
        let mut mantissa = 0u64;
        while let Some(&b) = bytes.get(at) {
            let d = b.wrapping_sub(b'0');
            if d > 9 {
                break;
            }
            if at - int_start == 19 {
                return None;
            }
            mantissa = mantissa * 10 + u64::from(d);
            at += 1;
        }
        let int_digits = at - int_start;
        if int_digits == 0 || (int_digits > 1 && bytes[int_start] == b'0') {
            return None;
        }
        let mut frac_digits = 0;
        if bytes.get(at) == Some(&b'.') {
            at += 1;
            while let Some(&b) = bytes.get(at) {
                let d = b.wrapping_sub(b'0');
                if d > 9 {
                    break;
                }
                if int_digits + frac_digits == 19 {
                    return None;
                }
                mantissa = mantissa * 10 + u64::from(d);
                at += 1;
                frac_digits += 1;
            }
            if frac_digits == 0 {
                return None;
            }
        }
        if matches!(bytes.get(at), Some(b'e' | b'E')) {
            return None;
        }
        Some((at, mantissa, frac_digits, negative))
    }

    /// A number by JSON's grammar: `-?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)?`.
    fn number(&mut self) -> Option<Raw<'a>> {
        let start = self.at;
        let negative = self.eat(b'-').is_some();
        let mut mantissa = 0u64;
        let int_start = self.at;
        let int_digits = self.digits(&mut mantissa);
        let mut digits = int_digits;
        if int_digits == 0 || (int_digits > 1 && self.bytes[int_start] == b'0') {
            return None;
        }
        let mut float = false;
        let mut exponent = 0i64;
        let mut exponent_exact = true;
        if self.eat(b'.').is_some() {
            let frac_digits = self.digits(&mut mantissa);
            if frac_digits == 0 {
                return None;
            }
            digits += frac_digits;
            exponent = -(frac_digits as i64);
            float = true;
        }
        if let Some(b'e' | b'E') = self.peek() {
            self.at += 1;
            let minus = match self.peek() {
                Some(b'-') => {
                    self.at += 1;
                    true
                }
                Some(b'+') => {
                    self.at += 1;
                    false
                }
                _ => false,
            };
            let mut e = 0u64;
            let e_digits = self.digits(&mut e);
            if e_digits == 0 {
                return None;
            }
            exponent_exact = e_digits <= 9;
            exponent += if minus { -(e as i64) } else { e as i64 };
            float = true;
        }
        let exact = digits <= 19 && exponent_exact;
        if !float {
            // Integers past u64 serde_json turns into floats; `-0` it reads as the float -0.0
            // and a negative past i64 as a float too: all left to it.
            return match (negative, exact) {
                (false, true) => Some(Raw::UInt(mantissa)),
                (true, true) => i64::try_from(mantissa).ok().filter(|&m| m > 0).map(|m| Raw::Int(-m)),
                _ => None,
            };
        }
        // Clinger's fast path: a mantissa an f64 holds exactly, times or over an exact power
        // of ten, is one correctly rounded operation. Anything else is parsed from the text.
        let f = match usize::try_from(exponent.unsigned_abs()) {
            Ok(e) if exact && mantissa <= 1 << 53 && e < POW10.len() => {
                let m = mantissa as f64;
                if exponent < 0 {
                    m / POW10[e]
                } else {
                    m * POW10[e]
                }
            }
            _ => std::str::from_utf8(&self.bytes[start..self.at]).ok()?.trim_start_matches('-').parse::<f64>().ok()?,
        };
        // serde_json refuses what overflows; let it say so.
        f.is_finite().then_some(Raw::Float(if negative { -f } else { f }))
    }
}

#[cfg(test)]
mod tests;
