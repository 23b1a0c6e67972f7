//! Makes the frames RabbitMQ sends parseable by lapin before lapin sees them.
//!
//! AMQP short strings (`type`, `message_id`, `correlation_id`, `reply_to`, header names, the exchange and
//! routing key of a delivery, ...) are byte strings on the wire, and RabbitMQ passes whatever a publisher
//! put in them. lapin's parser (amq-protocol) insists that they are UTF-8 and refuses the *whole frame*
//! otherwise, which drops the connection: every unsettled delivery on it goes back to its queue, the same
//! message comes back, and other users' messages in flight are redelivered with it until their delivery
//! limit dead-letters them. One publisher could so cost everyone else their submissions.
//!
//! [`Sanitizer`] sits on the inbound plaintext (under lapin, above TLS: see [`super::transport`]) and
//! rewrites, frame by frame:
//! - every short string that is not UTF-8 (in any method frame, and in a content header's properties
//!   and header names, nested tables and arrays included): each byte of an invalid sequence becomes `?`,
//!   so lengths, and so every enclosing length, stay as they were;
//! - a content header whose header table cannot be read at all (an unknown value type, lengths that do
//!   not add up): the table becomes empty;
//! - and, on the content header of a message whose properties (or whose `basic.deliver`, `basic.get-ok`
//!   or `basic.return` frame) were rewritten, adds the header [`INVALID_HEADER`] naming what was
//!   rewritten (`type,message_id`), so that the runner dead-letters that message with a reason instead of
//!   acting on altered properties.
//!
//! Frames that are already parseable pass byte for byte; frames it does not understand (an unknown
//! method, a wrong length) pass unchanged, and lapin refuses them as before. Bodies are never looked at,
//! nor buffered: they stream through as they arrive.

use std::collections::HashMap;

/// The header a rewritten message carries: the names of the properties that were not UTF-8, separated by
/// commas (`type`, `message_id`, `headers`, `routing_key`, ...). Under the `x-volcano-runner-` prefix, so
/// a dead-letter replay leaves it behind.
pub const INVALID_HEADER: &str = "x-volcano-runner-invalid-utf8";

/// The header a message whose headers were too large for the frames this client reads carries: the
/// ones left out, `name (N bytes)`, largest first (the same header a dead-letter copy names its own
/// left-out headers with).
pub const DROPPED_HEADER: &str = super::headers::DROPPED_HEADERS;

const FRAME_METHOD: u8 = 1;
const FRAME_HEADER: u8 = 2;
const FRAME_BODY: u8 = 3;
const FRAME_HEARTBEAT: u8 = 8;
const FRAME_END: u8 = 0xCE;
/// Type, channel and size.
const FRAME_HEAD: usize = 7;

/// Method and header frames larger than this are passed without a look rather than held in memory: no
/// broker sends one (frames are bounded by the negotiated `frame_max`, at most 1 MiB by default, see
/// `connection::DEFAULT_FRAME_MAX`), and lapin refuses it anyway.
pub const MAX_INSPECTED_FRAME: usize = 16 * 1024 * 1024;

/// What [`repair_frame`] made of one frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Repair {
    /// Parseable as it is: pass it unchanged.
    Clean,
    /// Rewritten into this frame, which lapin can parse.
    Rewritten(Vec<u8>),
    /// Not a frame this module understands (an unknown method, lengths that do not add up): pass it
    /// unchanged and let lapin judge.
    Unknown,
}

/// The argument types of AMQP 0-9-1 methods, as amq-protocol parses them.
#[derive(Debug, Clone, Copy)]
enum Arg {
    Octet,
    Short,
    Long,
    LongLong,
    /// Packed bits: one octet for up to eight.
    Bits,
    ShortStr(&'static str),
    LongStr,
    Table,
}

/// The arguments of each method amq-protocol knows (AMQP 0-9-1 with RabbitMQ's extensions), by class and
/// method id. The names are those a rewritten string is reported under.
fn method_args(class: u16, method: u16) -> Option<&'static [Arg]> {
    use Arg::*;
    Some(match (class, method) {
        // connection
        (10, 10) => &[Octet, Octet, Table, LongStr, LongStr],
        (10, 11) => &[Table, ShortStr("mechanism"), LongStr, ShortStr("locale")],
        (10, 20) | (10, 21) => &[LongStr],
        (10, 30) | (10, 31) => &[Short, Long, Short],
        (10, 40) => &[ShortStr("virtual_host"), ShortStr("capabilities"), Bits],
        (10, 41) => &[ShortStr("known_hosts")],
        (10, 50) | (20, 40) => &[Short, ShortStr("reply_text"), Short, Short],
        (10, 51) | (10, 61) | (10, 71) | (20, 41) => &[],
        (10, 60) => &[ShortStr("reason")],
        (10, 70) => &[LongStr, ShortStr("reason")],
        // channel
        (20, 10) => &[ShortStr("out_of_band")],
        (20, 11) => &[LongStr],
        (20, 20) | (20, 21) => &[Bits],
        // access
        (30, 10) => &[ShortStr("realm"), Bits],
        (30, 11) => &[Short],
        // exchange
        (40, 10) => &[Short, ShortStr("exchange"), ShortStr("type"), Bits, Table],
        (40, 11) | (40, 21) | (40, 31) | (40, 51) => &[],
        (40, 20) => &[Short, ShortStr("exchange"), Bits],
        (40, 30) | (40, 40) => &[
            Short,
            ShortStr("destination"),
            ShortStr("source"),
            ShortStr("routing_key"),
            Bits,
            Table,
        ],
        // queue
        (50, 10) => &[Short, ShortStr("queue"), Bits, Table],
        (50, 11) => &[ShortStr("queue"), Long, Long],
        (50, 20) => &[
            Short,
            ShortStr("queue"),
            ShortStr("exchange"),
            ShortStr("routing_key"),
            Bits,
            Table,
        ],
        (50, 21) | (50, 51) => &[],
        (50, 30) => &[Short, ShortStr("queue"), Bits],
        (50, 31) | (50, 41) => &[Long],
        (50, 40) => &[Short, ShortStr("queue"), Bits],
        (50, 50) => &[
            Short,
            ShortStr("queue"),
            ShortStr("exchange"),
            ShortStr("routing_key"),
            Table,
        ],
        // basic
        (60, 10) => &[Long, Short, Bits],
        (60, 11) | (60, 111) => &[],
        (60, 20) => &[
            Short,
            ShortStr("queue"),
            ShortStr("consumer_tag"),
            Bits,
            Table,
        ],
        (60, 21) | (60, 31) => &[ShortStr("consumer_tag")],
        (60, 30) => &[ShortStr("consumer_tag"), Bits],
        (60, 40) => &[Short, ShortStr("exchange"), ShortStr("routing_key"), Bits],
        (60, 50) => &[
            Short,
            ShortStr("reply_text"),
            ShortStr("exchange"),
            ShortStr("routing_key"),
        ],
        (60, 60) => &[
            ShortStr("consumer_tag"),
            LongLong,
            Bits,
            ShortStr("exchange"),
            ShortStr("routing_key"),
        ],
        (60, 70) => &[Short, ShortStr("queue"), Bits],
        (60, 71) => &[
            LongLong,
            Bits,
            ShortStr("exchange"),
            ShortStr("routing_key"),
            Long,
        ],
        (60, 72) => &[ShortStr("cluster_id")],
        (60, 80) | (60, 90) | (60, 120) => &[LongLong, Bits],
        (60, 100) | (60, 110) => &[Bits],
        // confirm, tx
        (85, 10) => &[Bits],
        (85, 11) | (90, 10) | (90, 11) | (90, 20) | (90, 21) | (90, 30) | (90, 31) => &[],
        _ => return None,
    })
}

/// The methods whose frame is followed by a content header: what was rewritten in them is reported on it.
fn carries_content(class: u16, method: u16) -> bool {
    matches!((class, method), (60, 50) | (60, 60) | (60, 71))
}

/// The content header properties in flag order (bit 15 first), as amq-protocol reads them.
#[derive(Debug, Clone, Copy)]
enum Prop {
    ShortStr(&'static str),
    Table,
    Octet,
    LongLong,
}

const PROPERTIES: [Prop; 14] = [
    Prop::ShortStr("content_type"),
    Prop::ShortStr("content_encoding"),
    Prop::Table,
    Prop::Octet,
    Prop::Octet,
    Prop::ShortStr("correlation_id"),
    Prop::ShortStr("reply_to"),
    Prop::ShortStr("expiration"),
    Prop::ShortStr("message_id"),
    Prop::LongLong,
    Prop::ShortStr("type"),
    Prop::ShortStr("user_id"),
    Prop::ShortStr("app_id"),
    Prop::ShortStr("cluster_id"),
];
const HEADERS_FLAG: u16 = 1 << 13;

/// Replaces each byte of every invalid UTF-8 sequence in `s` with `?`; whether anything was replaced.
fn repair_utf8(s: &mut [u8]) -> bool {
    let mut repaired = false;
    let mut at = 0;
    while at < s.len() {
        match std::str::from_utf8(&s[at..]) {
            Ok(_) => break,
            Err(e) => {
                let bad_from = at + e.valid_up_to();
                let bad_to = e.error_len().map_or(s.len(), |n| bad_from + n);
                s[bad_from..bad_to].fill(b'?');
                repaired = true;
                at = bad_to;
            }
        }
    }
    repaired
}

/// A cursor over a payload that is being repaired in place.
struct Cursor<'a> {
    bytes: &'a mut [u8],
    at: usize,
}

/// The payload does not have the structure its type says.
#[derive(Debug)]
struct Malformed;

impl Cursor<'_> {
    fn take(&mut self, n: usize) -> Result<std::ops::Range<usize>, Malformed> {
        let end = self.at.checked_add(n).ok_or(Malformed)?;
        if end > self.bytes.len() {
            return Err(Malformed);
        }
        let range = self.at..end;
        self.at = end;
        Ok(range)
    }

    fn u8(&mut self) -> Result<u8, Malformed> {
        let r = self.take(1)?;
        Ok(self.bytes[r.start])
    }

    fn u16(&mut self) -> Result<u16, Malformed> {
        let r = self.take(2)?;
        Ok(u16::from_be_bytes([
            self.bytes[r.start],
            self.bytes[r.start + 1],
        ]))
    }

    fn u32(&mut self) -> Result<u32, Malformed> {
        let r = self.take(4)?;
        let b = &self.bytes[r];
        Ok(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }

    /// A short string, repaired in place; whether it had to be.
    fn short_str(&mut self) -> Result<bool, Malformed> {
        let len = self.u8()?;
        let r = self.take(usize::from(len))?;
        Ok(repair_utf8(&mut self.bytes[r]))
    }

    fn long_bytes(&mut self) -> Result<(), Malformed> {
        let len = self.u32()?;
        self.take(len as usize).map(|_| ())
    }

    /// A field table, its names repaired in place (nested ones too); whether any had to be.
    fn table(&mut self) -> Result<bool, Malformed> {
        let len = self.u32()? as usize;
        let r = self.take(len)?;
        let mut inner = Cursor {
            bytes: &mut self.bytes[r],
            at: 0,
        };
        let mut repaired = false;
        while inner.at < inner.bytes.len() {
            repaired |= inner.short_str()?;
            repaired |= inner.value()?;
        }
        Ok(repaired)
    }

    fn array(&mut self) -> Result<bool, Malformed> {
        let len = self.u32()? as usize;
        let r = self.take(len)?;
        let mut inner = Cursor {
            bytes: &mut self.bytes[r],
            at: 0,
        };
        let mut repaired = false;
        while inner.at < inner.bytes.len() {
            repaired |= inner.value()?;
        }
        Ok(repaired)
    }

    /// A typed field value (the tags amq-protocol knows, with RabbitMQ's meaning of `s`).
    fn value(&mut self) -> Result<bool, Malformed> {
        let fixed = match self.u8()? {
            b't' | b'b' | b'B' => 1,
            b's' | b'U' | b'u' => 2,
            b'I' | b'i' | b'f' => 4,
            b'L' | b'l' | b'd' | b'T' => 8,
            b'D' => 5,
            b'V' => 0,
            b'S' | b'x' => {
                self.long_bytes()?;
                return Ok(false);
            }
            b'A' => return self.array(),
            b'F' => return self.table(),
            _ => return Err(Malformed),
        };
        self.take(fixed).map(|_| false)
    }

    fn done(&self) -> bool {
        self.at == self.bytes.len()
    }
}

/// Repairs a method frame's payload in place; the names of the arguments that were rewritten, or `None`
/// for a method it does not know or a payload that does not fit it.
fn repair_method(payload: &mut [u8]) -> Option<(u16, u16, Vec<&'static str>)> {
    let mut c = Cursor {
        bytes: payload,
        at: 0,
    };
    let class = c.u16().ok()?;
    let method = c.u16().ok()?;
    let args = method_args(class, method)?;
    let mut rewritten = Vec::new();
    for arg in args {
        let ok = match *arg {
            Arg::Octet | Arg::Bits => c.take(1).map(|_| ()),
            Arg::Short => c.take(2).map(|_| ()),
            Arg::Long => c.take(4).map(|_| ()),
            Arg::LongLong => c.take(8).map(|_| ()),
            Arg::LongStr => c.long_bytes(),
            Arg::ShortStr(name) => c.short_str().map(|bad| {
                if bad {
                    rewritten.push(name);
                }
            }),
            Arg::Table => c.table().map(|bad| {
                if bad {
                    rewritten.push("arguments");
                }
            }),
        };
        ok.ok()?;
    }
    c.done().then_some((class, method, rewritten))
}

/// What was found in a content header's properties.
struct HeaderScan {
    /// Properties rewritten in place.
    rewritten: Vec<&'static str>,
    /// Where the headers table is (start of its length, end), when the flag is set.
    headers: Option<(usize, usize)>,
    /// Whether the headers table could not be read (it is replaced).
    unreadable_headers: bool,
    /// Where the headers table goes when the flag is not set: after the first two properties.
    headers_insert_at: usize,
    /// Where the property list ends.
    end: usize,
}

/// Repairs a property list (flags, then the properties they announce) in place where lengths allow it,
/// up to its end; `None` when it is cut short. What follows it is not looked at.
fn scan_properties(props: &mut [u8]) -> Option<HeaderScan> {
    let mut c = Cursor {
        bytes: props,
        at: 0,
    };
    let flags = c.u16().ok()?;
    let mut scan = HeaderScan {
        rewritten: Vec::new(),
        headers: None,
        unreadable_headers: false,
        headers_insert_at: 0,
        end: 0,
    };
    for (i, prop) in PROPERTIES.iter().enumerate() {
        if i == 2 {
            scan.headers_insert_at = c.at;
        }
        if flags & (1 << (15 - i)) == 0 {
            continue;
        }
        match *prop {
            Prop::ShortStr(name) => {
                if c.short_str().ok()? {
                    scan.rewritten.push(name);
                }
            }
            Prop::Octet => {
                c.take(1).ok()?;
            }
            Prop::LongLong => {
                c.take(8).ok()?;
            }
            Prop::Table => {
                let start = c.at;
                let len = c.u32().ok()? as usize;
                let end = c.at.checked_add(len)?;
                if end > c.bytes.len() {
                    return None;
                }
                let mut table = Cursor {
                    bytes: &mut c.bytes[start..end],
                    at: 0,
                };
                match table.table() {
                    Ok(true) => scan.rewritten.push("headers"),
                    Ok(false) => {}
                    Err(Malformed) => {
                        scan.unreadable_headers = true;
                        scan.rewritten.push("headers");
                    }
                }
                c.at = end;
                scan.headers = Some((start, end));
            }
        }
    }
    scan.end = c.at;
    Some(scan)
}

/// Repairs a message's property list as it starts `data` (the flags, then the properties; the encoding
/// of a content header after its class, weight and body size): the repaired list, with the
/// [`INVALID_HEADER`] marker when anything had to be, and how many bytes of `data` the list took. `None`
/// when `data` is too short for the properties its flags announce. `carried` are names to report besides
/// (rewritten in the method frame that announced the message).
pub fn repair_properties(data: &[u8], carried: &[&'static str]) -> Option<(Vec<u8>, usize)> {
    let mut props = data.to_vec();
    let scan = scan_properties(&mut props)?;
    props.truncate(scan.end);
    let end = scan.end;
    if scan.rewritten.is_empty() && carried.is_empty() {
        return Some((props, end));
    }
    let mut names = carried.to_vec();
    names.extend_from_slice(&scan.rewritten);
    Some((mark_properties(&props, &scan, &names), end))
}

/// One table entry: `name` as a long string.
fn entry(name: &str, value: &str) -> Vec<u8> {
    let mut e = Vec::with_capacity(1 + name.len() + 5 + value.len());
    e.push(name.len() as u8);
    e.extend_from_slice(name.as_bytes());
    e.push(b'S');
    e.extend_from_slice(&(value.len() as u32).to_be_bytes());
    e.extend_from_slice(value.as_bytes());
    e
}

/// The property list with the marker added (and an unreadable header table replaced).
fn mark_properties(payload: &[u8], scan: &HeaderScan, names: &[&'static str]) -> Vec<u8> {
    let mut unique: Vec<&str> = Vec::new();
    for name in names {
        if !unique.contains(name) {
            unique.push(name);
        }
    }
    let names = unique;
    let marker = entry(INVALID_HEADER, &names.join(","));
    let mut out = Vec::with_capacity(payload.len() + marker.len() + 4);
    match scan.headers {
        Some((start, end)) => {
            out.extend_from_slice(&payload[..start]);
            // An unreadable table is left out; a readable one keeps its entries, the marker after them.
            let kept: &[u8] = if scan.unreadable_headers {
                &[]
            } else {
                &payload[start + 4..end]
            };
            let len = (kept.len() + marker.len()) as u32;
            out.extend_from_slice(&len.to_be_bytes());
            out.extend_from_slice(kept);
            out.extend_from_slice(&marker);
            out.extend_from_slice(&payload[end..]);
        }
        None => {
            let at = scan.headers_insert_at;
            out.extend_from_slice(&payload[..at]);
            out.extend_from_slice(&(marker.len() as u32).to_be_bytes());
            out.extend_from_slice(&marker);
            out.extend_from_slice(&payload[at..]);
            let flags = u16::from_be_bytes([out[0], out[1]]) | HEADERS_FLAG;
            out[..2].copy_from_slice(&flags.to_be_bytes());
        }
    }
    out
}

/// The property list `props` with the largest entries of its header table left out until it takes at
/// most `budget` bytes, and [`DROPPED_HEADER`] naming them, largest first, `name (N bytes)`. `None` when
/// the table cannot be read, or leaving every entry out is not enough.
fn shrink_headers(props: &[u8], scan: &HeaderScan, budget: usize) -> Option<Vec<u8>> {
    let (start, end) = scan.headers?;
    let mut table = props.get(start + 4..end)?.to_vec();
    let mut entries = Vec::new();
    let mut c = Cursor {
        bytes: &mut table,
        at: 0,
    };
    while c.at < c.bytes.len() {
        let from = c.at;
        c.short_str().ok()?;
        c.value().ok()?;
        entries.push((from, c.at));
    }
    let name = |(from, _): (usize, usize)| {
        let len = usize::from(table[from]);
        String::from_utf8_lossy(&table[from + 1..from + 1 + len]).into_owned()
    };
    let mut by_size: Vec<(usize, usize)> = entries.clone();
    by_size.sort_by_key(|(from, to)| std::cmp::Reverse(to - from));
    let outside = props.len() - (end - start) + 4;
    let mut dropped: Vec<(usize, usize)> = Vec::new();
    let mut kept_len = table.len();
    loop {
        let named: Vec<String> = dropped
            .iter()
            .map(|e| format!("{} ({} bytes)", name(*e), e.1 - e.0))
            .collect();
        let marker = entry(DROPPED_HEADER, &named.join(", "));
        if !dropped.is_empty() && outside + kept_len + marker.len() <= budget {
            let mut out = Vec::with_capacity(budget);
            out.extend_from_slice(&props[..start]);
            out.extend_from_slice(&((kept_len + marker.len()) as u32).to_be_bytes());
            for e in entries.iter().filter(|e| !dropped.contains(e)) {
                out.extend_from_slice(&table[e.0..e.1]);
            }
            out.extend_from_slice(&marker);
            out.extend_from_slice(&props[end..]);
            return Some(out);
        }
        let next = *by_size.get(dropped.len())?;
        kept_len -= next.1 - next.0;
        dropped.push(next);
    }
}

fn assemble(kind: u8, channel: [u8; 2], payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(payload.len() + FRAME_HEAD + 1);
    out.push(kind);
    out.extend_from_slice(&channel);
    out.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    out.extend_from_slice(payload);
    out.push(FRAME_END);
    out
}

/// Repairs one complete frame (head, payload and end octet) on its own. `carried` are the names rewritten
/// in the method frame that announced this content header (see [`Sanitizer`]).
///
/// A pure function: the fuzzer (`fuzz/fuzz_targets/amqp_frames.rs`) and the property tests drive it with
/// arbitrary frames and check that amq-protocol parses whatever is not [`Repair::Unknown`], and that a
/// frame it parses already comes back [`Repair::Clean`].
pub fn repair_frame(bytes: &[u8], carried: &[&'static str], frame_max: Option<usize>) -> Repair {
    repair_frame_inner(bytes, carried, frame_max).map_or(Repair::Unknown, |(repair, _)| repair)
}

/// [`repair_frame`], and for a method frame that announces content, what it rewrote.
fn repair_frame_inner(
    bytes: &[u8],
    carried: &[&'static str],
    frame_max: Option<usize>,
) -> Option<(Repair, Option<Vec<&'static str>>)> {
    if bytes.len() < FRAME_HEAD + 1 || bytes[bytes.len() - 1] != FRAME_END {
        return None;
    }
    let size = u32::from_be_bytes([bytes[3], bytes[4], bytes[5], bytes[6]]) as usize;
    if size != bytes.len() - FRAME_HEAD - 1 {
        return None;
    }
    let channel = [bytes[1], bytes[2]];
    let mut payload = bytes[FRAME_HEAD..bytes.len() - 1].to_vec();
    match bytes[0] {
        FRAME_METHOD => {
            let (class, method, rewritten) = repair_method(&mut payload)?;
            let announces = carries_content(class, method).then(|| rewritten.clone());
            let repair = if rewritten.is_empty() {
                Repair::Clean
            } else {
                Repair::Rewritten(assemble(FRAME_METHOD, channel, &payload))
            };
            Some((repair, announces))
        }
        FRAME_HEADER => {
            // Class, weight and body size, then the property list, which must end the payload.
            let mut scan = scan_properties(payload.get_mut(12..)?)?;
            let (head, props) = payload.split_at(12);
            if scan.end != props.len() {
                return None;
            }
            let too_large = frame_max.is_some_and(|max| bytes.len() > max);
            if scan.rewritten.is_empty() && carried.is_empty() {
                if !too_large {
                    return Some((Repair::Clean, None));
                }
                // Headers larger than the frames this client reads (the runner offers small frames,
                // see `connection::DEFAULT_FRAME_MAX`): the largest go, named in a header, so the
                // message is read and handled like any other (it reads `traceparent` alone).
                let budget = frame_max? - (bytes.len() - props.len());
                let shrunk = shrink_headers(props, &scan, budget)?;
                let mut p = head.to_vec();
                p.extend_from_slice(&shrunk);
                return Some((Repair::Rewritten(assemble(FRAME_HEADER, channel, &p)), None));
            }
            let mut names = carried.to_vec();
            names.extend_from_slice(&scan.rewritten);
            let header = |props: Vec<u8>| {
                let mut p = head.to_vec();
                p.extend_from_slice(&props);
                assemble(FRAME_HEADER, channel, &p)
            };
            let mut marked = header(mark_properties(props, &scan, &names));
            // The marker must not make the frame larger than lapin accepts: the message's own headers
            // then make way for it (the runner dead-letters the message either way).
            if frame_max.is_some_and(|max| marked.len() > max) && scan.headers.is_some() {
                scan.unreadable_headers = true;
                names.push("headers");
                marked = header(mark_properties(props, &scan, &names));
            }
            Some((Repair::Rewritten(marked), None))
        }
        FRAME_BODY | FRAME_HEARTBEAT => Some((Repair::Clean, None)),
        _ => None,
    }
}

/// Where the incremental [`Sanitizer`] is in the byte stream.
#[derive(Debug)]
enum State {
    /// Collecting a frame's head (type, channel, size) in the buffer.
    Head,
    /// Collecting a whole method or header frame of this many bytes in the buffer.
    Frame(usize),
    /// Passing this many more bytes of a body or heartbeat frame (or one too large to inspect).
    Stream(usize),
    /// Something that is not a frame (a protocol header refusing our version, garbage): everything from
    /// here passes unchanged, and lapin judges it.
    Passthrough,
}

/// The inbound byte stream of one connection, frame by frame: see the module documentation.
#[derive(Debug)]
pub struct Sanitizer {
    state: State,
    buffer: Vec<u8>,
    /// Names rewritten in a `basic.deliver`, `basic.get-ok` or `basic.return`, by channel, until that
    /// message's content header.
    announced: HashMap<u16, Vec<&'static str>>,
    /// Frames rewritten so far (a metric for tests and logs).
    rewritten: u64,
    /// The largest frame the client offers (0: no limit), and the server's from `connection.tune`: lapin
    /// refuses frames larger than the smaller of the two.
    client_frame_max: u32,
    server_frame_max: u32,
}

impl Sanitizer {
    /// For a connection whose client offers frames of at most `client_frame_max` bytes (0: any size).
    pub fn new(client_frame_max: u32) -> Self {
        Self {
            state: State::Head,
            buffer: Vec::new(),
            announced: HashMap::new(),
            rewritten: 0,
            client_frame_max,
            server_frame_max: 0,
        }
    }

    /// The negotiated frame size limit, once the server has said its own.
    fn frame_max(&self) -> Option<usize> {
        match (self.client_frame_max, self.server_frame_max) {
            (0, 0) => None,
            (0, n) | (n, 0) => Some(n as usize),
            (a, b) => Some(a.min(b) as usize),
        }
    }

    /// How many frames were rewritten.
    pub fn rewritten(&self) -> u64 {
        self.rewritten
    }

    /// Takes the next bytes read from the server and appends to `out` what lapin may read: everything up
    /// to the last complete frame, and the part of a body seen so far.
    pub fn push(&mut self, mut input: &[u8], out: &mut Vec<u8>) {
        while !input.is_empty() {
            match self.state {
                State::Passthrough => {
                    out.extend_from_slice(input);
                    return;
                }
                State::Stream(left) => {
                    let n = left.min(input.len());
                    out.extend_from_slice(&input[..n]);
                    input = &input[n..];
                    self.state = if n == left {
                        State::Head
                    } else {
                        State::Stream(left - n)
                    };
                }
                State::Head => {
                    let n = (FRAME_HEAD - self.buffer.len()).min(input.len());
                    self.buffer.extend_from_slice(&input[..n]);
                    input = &input[n..];
                    if self.buffer.len() == FRAME_HEAD {
                        self.head();
                        if !matches!(self.state, State::Frame(_)) {
                            out.append(&mut self.buffer);
                        }
                    }
                }
                State::Frame(total) => {
                    let n = (total - self.buffer.len()).min(input.len());
                    self.buffer.extend_from_slice(&input[..n]);
                    input = &input[n..];
                    if self.buffer.len() == total {
                        self.whole_frame(out);
                    }
                }
            }
        }
    }

    /// What to do with the frame whose head is in the buffer.
    fn head(&mut self) {
        let b = &self.buffer;
        let size = u32::from_be_bytes([b[3], b[4], b[5], b[6]]) as usize;
        let total = FRAME_HEAD + size + 1;
        self.state = match b[0] {
            FRAME_METHOD | FRAME_HEADER if total <= MAX_INSPECTED_FRAME => State::Frame(total),
            FRAME_METHOD | FRAME_HEADER | FRAME_BODY | FRAME_HEARTBEAT => State::Stream(size + 1),
            _ => State::Passthrough,
        };
    }

    fn whole_frame(&mut self, out: &mut Vec<u8>) {
        let frame = std::mem::take(&mut self.buffer);
        let channel = u16::from_be_bytes([frame[1], frame[2]]);
        let carried = if frame[0] == FRAME_HEADER {
            self.announced.remove(&channel).unwrap_or_default()
        } else {
            Vec::new()
        };
        // connection.tune: the server's frame_max.
        if frame.len() == FRAME_HEAD + 12 + 1
            && frame[0] == FRAME_METHOD
            && frame[7..11] == [0, 10, 0, 30]
        {
            self.server_frame_max =
                u32::from_be_bytes([frame[13], frame[14], frame[15], frame[16]]);
        }
        match repair_frame_inner(&frame, &carried, self.frame_max()) {
            Some((repair, announces)) => {
                // A new message on the channel: what it announces replaces anything left over.
                match announces {
                    Some(names) if !names.is_empty() => {
                        self.announced.insert(channel, names);
                    }
                    Some(_) => {
                        self.announced.remove(&channel);
                    }
                    None => {}
                }
                match repair {
                    Repair::Rewritten(bytes) => {
                        self.rewritten += 1;
                        out.extend_from_slice(&bytes);
                    }
                    Repair::Clean | Repair::Unknown => out.extend_from_slice(&frame),
                }
                self.state = State::Head;
            }
            None => {
                out.extend_from_slice(&frame);
                // A frame that does not end where its size says is not AMQP any more: stop looking.
                self.state = if frame.last() == Some(&FRAME_END) {
                    State::Head
                } else {
                    State::Passthrough
                };
            }
        }
        // The buffer of a large frame is not kept for the connection's life.
        if frame.len() <= 64 * 1024 {
            self.buffer = frame;
            self.buffer.clear();
        }
    }

    /// Bytes held back because their frame is not complete yet (they are handed on at the end of the
    /// stream, for lapin to judge).
    pub fn finish(&mut self, out: &mut Vec<u8>) {
        out.append(&mut self.buffer);
        self.state = State::Passthrough;
    }
}

/// Hand encoders of AMQP frames with arbitrary bytes where the protocol has short strings, for the tests
/// here, the broker tests' raw publisher and the fuzzer's seeds.
pub mod encode {
    use super::{FRAME_END, FRAME_HEADER, FRAME_METHOD, PROPERTIES, Prop};

    /// A short string (at most 255 bytes: longer ones are cut).
    pub fn short_str(out: &mut Vec<u8>, s: &[u8]) {
        let s = &s[..s.len().min(255)];
        out.push(s.len() as u8);
        out.extend_from_slice(s);
    }

    /// A field table of long-string values, names as given.
    pub fn table(out: &mut Vec<u8>, entries: &[(&[u8], &[u8])]) {
        let mut body = Vec::new();
        for (name, value) in entries {
            short_str(&mut body, name);
            body.push(b'S');
            body.extend_from_slice(&(value.len() as u32).to_be_bytes());
            body.extend_from_slice(value);
        }
        out.extend_from_slice(&(body.len() as u32).to_be_bytes());
        out.extend_from_slice(&body);
    }

    /// A whole frame.
    pub fn frame(kind: u8, channel: u16, payload: &[u8]) -> Vec<u8> {
        let mut out = vec![kind];
        out.extend_from_slice(&channel.to_be_bytes());
        out.extend_from_slice(&(payload.len() as u32).to_be_bytes());
        out.extend_from_slice(payload);
        out.push(FRAME_END);
        out
    }

    /// A method frame: class, method and the encoded arguments.
    pub fn method(channel: u16, class: u16, method: u16, args: &[u8]) -> Vec<u8> {
        let mut payload = Vec::new();
        payload.extend_from_slice(&class.to_be_bytes());
        payload.extend_from_slice(&method.to_be_bytes());
        payload.extend_from_slice(args);
        frame(FRAME_METHOD, channel, &payload)
    }

    /// Message properties as raw bytes, by the names of [`PROPERTIES`](super::PROPERTIES): short strings
    /// are given as bytes, `headers` as an encoded table, `delivery_mode` and `priority` as one byte,
    /// `timestamp` as eight.
    #[derive(Debug, Clone, Default)]
    pub struct RawProperties {
        pub content_type: Option<Vec<u8>>,
        pub content_encoding: Option<Vec<u8>>,
        /// An encoded field table (length included), see [`table`].
        pub headers: Option<Vec<u8>>,
        pub delivery_mode: Option<u8>,
        pub priority: Option<u8>,
        pub correlation_id: Option<Vec<u8>>,
        pub reply_to: Option<Vec<u8>>,
        pub expiration: Option<Vec<u8>>,
        pub message_id: Option<Vec<u8>>,
        pub timestamp: Option<u64>,
        pub kind: Option<Vec<u8>>,
        pub user_id: Option<Vec<u8>>,
        pub app_id: Option<Vec<u8>>,
        pub cluster_id: Option<Vec<u8>>,
    }

    /// A content header frame (class basic) for a body of `body_size` bytes.
    pub fn content_header(channel: u16, body_size: u64, p: &RawProperties) -> Vec<u8> {
        let mut payload = Vec::new();
        payload.extend_from_slice(&60u16.to_be_bytes());
        payload.extend_from_slice(&0u16.to_be_bytes());
        payload.extend_from_slice(&body_size.to_be_bytes());
        let mut flags = 0u16;
        let mut props = Vec::new();
        let strings = [
            &p.content_type,
            &p.content_encoding,
            &None,
            &None,
            &None,
            &p.correlation_id,
            &p.reply_to,
            &p.expiration,
            &p.message_id,
            &None,
            &p.kind,
            &p.user_id,
            &p.app_id,
            &p.cluster_id,
        ];
        for (i, prop) in PROPERTIES.iter().enumerate() {
            let bit = 1 << (15 - i);
            match (prop, i) {
                (Prop::ShortStr(_), _) => {
                    if let Some(s) = strings[i] {
                        flags |= bit;
                        short_str(&mut props, s);
                    }
                }
                (Prop::Table, _) => {
                    if let Some(t) = &p.headers {
                        flags |= bit;
                        props.extend_from_slice(t);
                    }
                }
                (Prop::Octet, 3) => {
                    if let Some(v) = p.delivery_mode {
                        flags |= bit;
                        props.push(v);
                    }
                }
                (Prop::Octet, _) => {
                    if let Some(v) = p.priority {
                        flags |= bit;
                        props.push(v);
                    }
                }
                (Prop::LongLong, _) => {
                    if let Some(v) = p.timestamp {
                        flags |= bit;
                        props.extend_from_slice(&v.to_be_bytes());
                    }
                }
            }
        }
        payload.extend_from_slice(&flags.to_be_bytes());
        payload.extend_from_slice(&props);
        frame(FRAME_HEADER, channel, &payload)
    }

    /// `basic.deliver` with the given consumer tag, exchange and routing key bytes.
    pub fn deliver(
        channel: u16,
        tag: &[u8],
        delivery_tag: u64,
        exchange: &[u8],
        key: &[u8],
    ) -> Vec<u8> {
        let mut args = Vec::new();
        short_str(&mut args, tag);
        args.extend_from_slice(&delivery_tag.to_be_bytes());
        args.push(0);
        short_str(&mut args, exchange);
        short_str(&mut args, key);
        method(channel, 60, 60, &args)
    }
}

#[cfg(test)]
mod tests {
    use amq_protocol::frame::{AMQPFrame, parse_frame};
    use amq_protocol::protocol::{AMQPClass, basic::AMQPMethod};
    use lapin::types::AMQPValue;
    use proptest::prelude::*;

    use super::encode::*;
    use super::*;

    fn parse(bytes: &[u8]) -> Option<AMQPFrame> {
        match parse_frame(bytes) {
            Ok(([], frame)) => Some(frame),
            _ => None,
        }
    }

    fn sanitized(bytes: &[u8]) -> Vec<u8> {
        let mut s = Sanitizer::new(0);
        let mut out = Vec::new();
        s.push(bytes, &mut out);
        s.finish(&mut out);
        out
    }

    fn header_of(frame: &AMQPFrame) -> &lapin::BasicProperties {
        match frame {
            AMQPFrame::Header(_, h) => &h.properties,
            other => panic!("not a content header: {other:?}"),
        }
    }

    fn marker(props: &lapin::BasicProperties) -> Option<String> {
        match props.headers().as_ref()?.inner().get(INVALID_HEADER)? {
            AMQPValue::LongString(s) => Some(String::from_utf8_lossy(s.as_bytes()).into_owned()),
            other => panic!("marker of another type: {other:?}"),
        }
    }

    fn submission(kind: &[u8]) -> RawProperties {
        let mut headers = Vec::new();
        table(&mut headers, &[(b"traceparent", b"00-abc")]);
        RawProperties {
            content_type: Some(b"application/json".to_vec()),
            headers: Some(headers),
            delivery_mode: Some(2),
            message_id: Some(b"m-1".to_vec()),
            kind: Some(kind.to_vec()),
            timestamp: Some(1_700_000_000),
            ..RawProperties::default()
        }
    }

    #[test]
    fn valid_frames_pass_byte_for_byte() {
        let mut stream = deliver(1, b"ctag", 7, b"jobs", b"submit");
        stream.extend(content_header(
            1,
            3,
            &submission(b"volcano_runner.v1.SubmitJob"),
        ));
        stream.extend(frame(FRAME_BODY, 1, b"{}\n"));
        stream.extend(frame(FRAME_HEARTBEAT, 0, b""));
        assert_eq!(sanitized(&stream), stream);
    }

    #[test]
    fn an_invalid_type_is_rewritten_in_place_and_named_in_the_marker() {
        let raw = content_header(1, 3, &submission(b"volcano_runner.v1.Submit\xc3Job"));
        assert!(parse(&raw).is_none(), "amq-protocol refuses it as it is");
        let out = sanitized(&raw);
        let parsed = parse(&out).expect("parseable after the rewrite");
        let props = header_of(&parsed);
        assert_eq!(
            props.kind().as_ref().map(|s| s.as_str()),
            Some("volcano_runner.v1.Submit?Job")
        );
        assert_eq!(marker(props).as_deref(), Some("type"));
        // The message's own headers stay.
        let headers = props.headers().as_ref().unwrap().inner();
        assert!(headers.contains_key("traceparent"));
    }

    #[test]
    fn every_short_string_property_is_named() {
        let bad = b"x\xff\xfey".to_vec();
        let p = RawProperties {
            content_type: Some(bad.clone()),
            content_encoding: Some(bad.clone()),
            correlation_id: Some(bad.clone()),
            reply_to: Some(bad.clone()),
            expiration: Some(bad.clone()),
            message_id: Some(bad.clone()),
            kind: Some(bad.clone()),
            user_id: Some(bad.clone()),
            app_id: Some(bad.clone()),
            cluster_id: Some(bad),
            ..RawProperties::default()
        };
        let out = sanitized(&content_header(2, 0, &p));
        let parsed = parse(&out).expect("parseable");
        let props = header_of(&parsed);
        assert_eq!(
            marker(props).as_deref(),
            Some(
                "content_type,content_encoding,correlation_id,reply_to,expiration,message_id,type,\
                 user_id,app_id,cluster_id"
            )
        );
        assert_eq!(props.message_id().as_ref().unwrap().as_str(), "x??y");
    }

    #[test]
    fn header_names_nested_ones_too_are_rewritten() {
        // {"ok": "v", "a\xff": "v", "nested": {"b\xc3": 1}}
        let mut inner = Vec::new();
        short_str(&mut inner, b"b\xc3");
        inner.extend_from_slice(b"I\0\0\0\x01");
        let mut body = Vec::new();
        short_str(&mut body, b"ok");
        body.extend_from_slice(b"S\0\0\0\x01v");
        short_str(&mut body, b"a\xff");
        body.extend_from_slice(b"S\0\0\0\x01v");
        short_str(&mut body, b"nested");
        body.push(b'F');
        body.extend_from_slice(&(inner.len() as u32).to_be_bytes());
        body.extend_from_slice(&inner);
        let mut headers = (body.len() as u32).to_be_bytes().to_vec();
        headers.extend_from_slice(&body);
        let p = RawProperties {
            headers: Some(headers),
            ..RawProperties::default()
        };
        let raw = content_header(1, 0, &p);
        assert!(parse(&raw).is_none());
        let parsed = parse(&sanitized(&raw)).expect("parseable");
        let props = header_of(&parsed);
        assert_eq!(marker(props).as_deref(), Some("headers"));
        let headers = props.headers().as_ref().unwrap().inner();
        assert!(headers.contains_key("ok") && headers.contains_key("a?"));
    }

    #[test]
    fn an_unreadable_header_table_is_replaced_by_the_marker() {
        // A value of a type nobody knows ('Z'): its length cannot be known.
        let mut body = Vec::new();
        short_str(&mut body, b"x");
        body.extend_from_slice(b"Z\x01\x02");
        let mut headers = (body.len() as u32).to_be_bytes().to_vec();
        headers.extend_from_slice(&body);
        let p = RawProperties {
            headers: Some(headers),
            message_id: Some(b"m".to_vec()),
            ..RawProperties::default()
        };
        let raw = content_header(1, 0, &p);
        assert!(parse(&raw).is_none());
        let parsed = parse(&sanitized(&raw)).expect("parseable");
        let props = header_of(&parsed);
        assert_eq!(marker(props).as_deref(), Some("headers"));
        assert_eq!(props.headers().as_ref().unwrap().inner().len(), 1);
        assert_eq!(props.message_id().as_ref().unwrap().as_str(), "m");
    }

    #[test]
    fn a_marker_is_added_where_there_were_no_headers() {
        let p = RawProperties {
            content_type: Some(b"application/json".to_vec()),
            delivery_mode: Some(2),
            reply_to: Some(b"\x80".to_vec()),
            ..RawProperties::default()
        };
        let parsed = parse(&sanitized(&content_header(1, 0, &p))).expect("parseable");
        let props = header_of(&parsed);
        assert_eq!(marker(props).as_deref(), Some("reply_to"));
        assert_eq!(
            props.content_type().as_ref().unwrap().as_str(),
            "application/json"
        );
        assert_eq!(*props.delivery_mode(), Some(2));
    }

    #[test]
    fn a_routing_key_rewritten_in_the_delivery_is_named_on_its_content_header() {
        let mut stream = deliver(3, b"ctag", 1, b"jobs", b"sub\xffmit");
        stream.extend(content_header(5, 0, &RawProperties::default()));
        stream.extend(content_header(3, 0, &RawProperties::default()));
        stream.extend(content_header(3, 0, &RawProperties::default()));
        let out = sanitized(&stream);
        let mut rest: &[u8] = &out;
        let mut frames = Vec::new();
        while !rest.is_empty() {
            let (r, f) = parse_frame(rest).expect("every frame parses");
            frames.push(f);
            rest = r;
        }
        match &frames[0] {
            AMQPFrame::Method(3, AMQPClass::Basic(AMQPMethod::Deliver(d))) => {
                assert_eq!(d.routing_key.as_str(), "sub?mit");
            }
            other => panic!("{other:?}"),
        }
        // Another channel's message is not marked; this channel's next one is, once.
        assert_eq!(marker(header_of(&frames[1])), None);
        assert_eq!(
            marker(header_of(&frames[2])).as_deref(),
            Some("routing_key")
        );
        assert_eq!(marker(header_of(&frames[3])), None);
    }

    #[test]
    fn a_server_text_that_is_not_utf8_is_rewritten_too() {
        let mut args = Vec::new();
        args.extend_from_slice(&404u16.to_be_bytes());
        short_str(&mut args, b"NOT_FOUND - no queue 'q\xff'");
        args.extend_from_slice(&[0, 50, 0, 10]);
        let raw = method(1, 20, 40, &args);
        assert!(parse(&raw).is_none());
        assert!(parse(&sanitized(&raw)).is_some());
    }

    #[test]
    fn the_marker_never_makes_a_frame_larger_than_the_negotiated_size() {
        let big = vec![b'v'; 4000];
        let mut headers = Vec::new();
        table(&mut headers, &[(b"big", &big)]);
        let p = RawProperties {
            headers: Some(headers),
            kind: Some(b"\xff".to_vec()),
            ..RawProperties::default()
        };
        let raw = content_header(1, 0, &p);
        let limit = raw.len() + 10;
        let Repair::Rewritten(out) = repair_frame(&raw, &[], Some(limit)) else {
            panic!("not rewritten")
        };
        assert!(out.len() <= limit, "{} > {limit}", out.len());
        let parsed = parse(&out).expect("parseable");
        assert_eq!(marker(header_of(&parsed)).as_deref(), Some("type,headers"));
        // Without a limit, the headers stay.
        let Repair::Rewritten(out) = repair_frame(&raw, &[], None) else {
            panic!("not rewritten")
        };
        assert!(
            header_of(&parse(&out).unwrap())
                .headers()
                .as_ref()
                .unwrap()
                .inner()
                .contains_key("big")
        );
    }

    #[test]
    fn headers_too_large_for_the_frame_make_way_largest_first_and_are_named() {
        let (big, bigger) = (vec![b'v'; 3000], vec![b'w'; 5000]);
        let traceparent = b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let mut headers = Vec::new();
        table(
            &mut headers,
            &[
                (b"big", &big),
                (b"traceparent", traceparent),
                (b"bigger", &bigger),
            ],
        );
        let p = RawProperties {
            headers: Some(headers),
            content_type: Some(b"application/json".to_vec()),
            ..RawProperties::default()
        };
        let raw = content_header(1, 10, &p);
        assert_eq!(
            repair_frame(&raw, &[], Some(raw.len())),
            Repair::Clean,
            "it fits"
        );
        let limit = raw.len() - 1000;
        let Repair::Rewritten(out) = repair_frame(&raw, &[], Some(limit)) else {
            panic!("not rewritten")
        };
        assert!(out.len() <= limit, "{} > {limit}", out.len());
        let parsed = parse(&out).expect("parseable");
        let props = header_of(&parsed);
        let kept = props.headers().as_ref().unwrap().inner();
        assert!(
            kept.contains_key("traceparent") && kept.contains_key("big"),
            "{kept:?}"
        );
        assert!(!kept.contains_key("bigger"));
        assert_eq!(
            kept.get(DROPPED_HEADER),
            Some(&AMQPValue::LongString("bigger (5012 bytes)".into()))
        );
        assert_eq!(marker(props), None, "nothing was invalid");
        assert_eq!(
            props.content_type().as_ref().unwrap().as_str(),
            "application/json"
        );
        // Smaller still: both large ones go, the largest named first.
        let Repair::Rewritten(out) = repair_frame(&raw, &[], Some(raw.len() - 6000)) else {
            panic!("not rewritten")
        };
        let parsed = parse(&out).expect("parseable");
        let kept = header_of(&parsed).headers().clone().unwrap();
        assert_eq!(
            kept.inner().get(DROPPED_HEADER),
            Some(&AMQPValue::LongString(
                "bigger (5012 bytes), big (3009 bytes)".into()
            ))
        );
        assert!(kept.inner().contains_key("traceparent"));
        // The stream does the same, with the size the client offered.
        let mut s = Sanitizer::new(u32::try_from(limit).unwrap());
        let mut streamed = Vec::new();
        s.push(&raw, &mut streamed);
        assert!(streamed.len() <= limit && parse(&streamed).is_some());
    }

    #[test]
    fn what_is_not_a_frame_passes_unchanged() {
        // The server refusing our protocol version answers with its own protocol header.
        assert_eq!(sanitized(b"AMQP\x00\x00\x09\x01"), b"AMQP\x00\x00\x09\x01");
        // An unknown method, a size that does not match.
        let unknown = method(1, 60, 99, b"\x03abc");
        assert_eq!(repair_frame(&unknown, &[], None), Repair::Unknown);
        assert_eq!(sanitized(&unknown), unknown);
        let mut short = content_header(1, 0, &RawProperties::default());
        short[6] += 1;
        assert_eq!(sanitized(&short), short);
    }

    fn bytes() -> impl Strategy<Value = Vec<u8>> {
        prop_oneof![
            proptest::collection::vec(any::<u8>(), 0..40),
            "[a-z./-]{0,40}".prop_map(String::into_bytes),
        ]
    }

    prop_compose! {
        fn raw_properties()(
            strings in proptest::collection::vec(proptest::option::of(bytes()), 10),
            names in proptest::collection::vec((bytes(), bytes()), 0..4),
            with_headers in any::<bool>(),
            delivery_mode in proptest::option::of(any::<u8>()),
            timestamp in proptest::option::of(any::<u64>()),
        ) -> RawProperties {
            let headers = with_headers.then(|| {
                let entries: Vec<(&[u8], &[u8])> =
                    names.iter().map(|(n, v)| (n.as_slice(), v.as_slice())).collect();
                let mut t = Vec::new();
                table(&mut t, &entries);
                t
            });
            RawProperties {
                content_type: strings[0].clone(),
                content_encoding: strings[1].clone(),
                headers,
                delivery_mode,
                priority: None,
                correlation_id: strings[2].clone(),
                reply_to: strings[3].clone(),
                expiration: strings[4].clone(),
                message_id: strings[5].clone(),
                timestamp,
                kind: strings[6].clone(),
                user_id: strings[7].clone(),
                app_id: strings[8].clone(),
                cluster_id: strings[9].clone(),
            }
        }
    }

    fn utf8(s: &Option<Vec<u8>>) -> bool {
        s.as_ref()
            .is_none_or(|s| std::str::from_utf8(&s[..s.len().min(255)]).is_ok())
    }

    proptest! {
        /// Whatever bytes a publisher puts in the properties and header names, the content header comes
        /// out parseable; untouched when it was parseable, marked with exactly what was not UTF-8
        /// otherwise.
        #[test]
        fn any_properties_come_out_parseable(p in raw_properties(), chunk in 1usize..64) {
            let raw = content_header(1, 10, &p);
            let mut s = Sanitizer::new(0);
            let mut out = Vec::new();
            for piece in raw.chunks(chunk) {
                s.push(piece, &mut out);
            }
            let parsed = parse(&out).expect("parseable");
            let bad: Vec<&str> = [
                ("content_type", &p.content_type),
                ("content_encoding", &p.content_encoding),
                ("correlation_id", &p.correlation_id),
                ("reply_to", &p.reply_to),
                ("expiration", &p.expiration),
                ("message_id", &p.message_id),
                ("type", &p.kind),
                ("user_id", &p.user_id),
                ("app_id", &p.app_id),
                ("cluster_id", &p.cluster_id),
            ]
            .iter()
            .filter(|(_, v)| !utf8(v))
            .map(|(n, _)| *n)
            .collect();
            let header_names_ok = p.headers.as_ref().is_none_or(|_| {
                parse(&content_header(1, 10, &RawProperties { headers: p.headers.clone(), ..Default::default() })).is_some()
            });
            let mut expected = bad.clone();
            if !header_names_ok {
                expected.push("headers");
            }
            if expected.is_empty() {
                prop_assert_eq!(&out, &raw);
                prop_assert!(parse(&raw).is_some());
            } else {
                prop_assert!(parse(&raw).is_none());
                let props = header_of(&parsed);
                let mut got: Vec<String> = marker(props).unwrap().split(',').map(str::to_owned).collect();
                got.sort();
                let mut want: Vec<String> = expected.iter().map(|s| (*s).to_owned()).collect();
                want.sort();
                prop_assert_eq!(got, want);
            }
        }

        /// Arbitrary bytes: a frame amq-protocol parses passes unchanged, and whatever the rewriter
        /// rewrites, amq-protocol parses.
        #[test]
        fn arbitrary_frames(kind in prop_oneof![Just(1u8), Just(2u8)], channel in 0u16..3, payload in proptest::collection::vec(any::<u8>(), 0..80)) {
            let raw = frame(kind, channel, &payload);
            match repair_frame(&raw, &[], None) {
                Repair::Clean => prop_assert!(parse(&raw).is_some()),
                Repair::Rewritten(out) => {
                    prop_assert!(parse(&raw).is_none());
                    prop_assert!(parse(&out).is_some());
                }
                Repair::Unknown => prop_assert!(parse(&raw).is_none()),
            }
        }
    }
}
