//! Reading one page of a metadata list (`PartialObjectMetadataList`) for the only fields the full
//! reconciliation compares: each object's namespace, name and resourceVersion, and the page's own
//! resourceVersion and continue token.
//!
//! At 10,000 jobs a reconciliation reads about 25 MB of metadata (a job's annotations alone are over half
//! a kilobyte), and building a serde tree of it, even one that ignores nearly every field, was the
//! largest part of a pass. This reader walks the JSON structure, skipping every value it does not want
//! (strings eight bytes at a time, objects and arrays by a vector search for their brackets), and
//! borrows what it keeps from the page's text. It is not a validator: the text comes from the API
//! server. Malformed text still gives an error naming the byte where reading stopped, never a panic.
//! Keys are compared as written: an API server does not escape plain ASCII letters in field names.

use std::borrow::Cow;

/// Why a page could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("malformed metadata list at byte {at}: {what}")]
pub struct PageError {
    pub at: usize,
    pub what: &'static str,
}

/// One listed object. A missing or `null` field is `None`.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Object<'a> {
    pub namespace: Option<Cow<'a, str>>,
    pub name: Option<Cow<'a, str>>,
    pub resource_version: Option<Cow<'a, str>>,
}

/// The list's own metadata.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct PageMeta<'a> {
    pub resource_version: Option<Cow<'a, str>>,
    pub continue_token: Option<Cow<'a, str>>,
}

/// Reads `text`, calling `each` for every item in order; returns the list's metadata.
///
/// `text` is the response body as it came: bytes, not a checked `str`. Only the strings kept are checked
/// for UTF-8 (a page is hundreds of kilobytes, of which a few dozen bytes per object are kept).
pub fn read<'a>(text: &'a [u8], mut each: impl FnMut(Object<'a>)) -> Result<PageMeta<'a>> {
    let mut s = Scanner { text, i: 0 };
    let mut meta = PageMeta::default();
    s.object(|s, key| match key {
        b"metadata" => s.nullable_object(|s, key| match key {
            b"resourceVersion" => s.string_field(&mut meta.resource_version),
            b"continue" => s.string_field(&mut meta.continue_token),
            _ => s.skip(),
        }),
        b"items" => s.nullable_array(|s| {
            let mut object = Object::default();
            s.object(|s, key| match key {
                b"metadata" => s.nullable_object(|s, key| match key {
                    b"namespace" => s.string_field(&mut object.namespace),
                    b"name" => s.string_field(&mut object.name),
                    b"resourceVersion" => s.string_field(&mut object.resource_version),
                    _ => s.skip(),
                }),
                _ => s.skip(),
            })?;
            each(object);
            Ok(())
        }),
        _ => s.skip(),
    })?;
    s.ws();
    if s.i < s.text.len() {
        return Err(s.error("text after the list"));
    }
    Ok(meta)
}

/// Marks the bytes of `word` equal to `needle`: the high bit of each such byte is set, and nothing else.
/// Exact in every byte (no borrow from one byte to the next), so the marks can be counted as well as
/// searched.
fn marks(word: u64, needle: u8) -> u64 {
    const LOW7: u64 = u64::from_ne_bytes([0x7f; 8]);
    // A byte of `v` is zero where the word has the needle; its high bit survives only then.
    let v = word ^ u64::from_ne_bytes([needle; 8]);
    !(((v & LOW7) + LOW7) | v | LOW7)
}

/// The first of `needles` in `bytes` from `from` on. Eight bytes at a time in a register: the strings of
/// a metadata list are mostly shorter than a vector search's setup is worth (annotation keys and values
/// of a few dozen bytes; `memchr::memchr2` made a page's reading a third slower), and finding their
/// ends is most of a page's reading.
fn find_any<const N: usize>(bytes: &[u8], from: usize, needles: [u8; N]) -> Option<usize> {
    let mut at = from;
    while let Some(chunk) = bytes.get(at..at + 8) {
        let word = u64::from_le_bytes(chunk.try_into().expect("eight bytes"));
        let found = needles.iter().fold(0, |m, &n| m | marks(word, n));
        if found != 0 {
            return Some(at + (found.trailing_zeros() / 8) as usize);
        }
        at += 8;
    }
    bytes
        .get(at..)?
        .iter()
        .position(|b| needles.contains(b))
        .map(|p| at + p)
}

/// Where the object or array opening at `start` (with `open`) ends, found without stepping through its
/// strings, or `None` when that cannot be told this way (the caller then walks it string by string).
///
/// Skipped values are most of a page (annotations, labels, owner references), and their strings are
/// short: walking them string by string cost more than the rest of the page. Here a vector search
/// (`memchr`) finds the brackets of the value's kind, and each one counts only if the text from `start`
/// up to it holds no backslash and an even number of quotes: then no string is open there, so the
/// bracket is structure, not text. An escape, a bracket inside a string or no end at all gives `None`,
/// never a wrong end. Within well-formed JSON, brackets of the other kind are balanced on their own.
fn container_end(text: &[u8], start: usize, open: u8, close: u8) -> Option<usize> {
    let mut depth = 0usize;
    let mut from = start;
    for at in memchr::memchr2_iter(open, close, text.get(start..)?) {
        let at = start + at;
        let between = &text[from..at];
        if odd_quotes(between) || memchr::memchr(b'\\', between).is_some() {
            return None;
        }
        from = at + 1;
        if text[at] == open {
            depth += 1;
        } else {
            depth = depth.checked_sub(1)?;
            if depth == 0 {
                return Some(at + 1);
            }
        }
    }
    None
}

/// Whether `bytes` holds an odd number of quotes. Eight bytes at a time: as only the parity matters, the
/// [`marks`] of all words are folded with XOR and counted once.
fn odd_quotes(bytes: &[u8]) -> bool {
    let (words, rest) = bytes.as_chunks::<8>();
    let folded = words
        .iter()
        .fold(0u64, |acc, w| acc ^ marks(u64::from_ne_bytes(*w), b'"'));
    let rest = rest.iter().filter(|&&b| b == b'"').count();
    (folded.count_ones() as usize + rest) % 2 == 1
}

struct Scanner<'a> {
    text: &'a [u8],
    i: usize,
}

type Result<T> = std::result::Result<T, PageError>;

impl<'a> Scanner<'a> {
    fn error(&self, what: &'static str) -> PageError {
        PageError { at: self.i, what }
    }

    fn bytes(&self) -> &'a [u8] {
        self.text
    }

    fn ws(&mut self) {
        while let Some(b' ' | b'\n' | b'\r' | b'\t') = self.bytes().get(self.i) {
            self.i += 1;
        }
    }

    /// The next byte that is not white space (not consumed).
    fn peek(&mut self) -> Result<u8> {
        self.ws();
        self.bytes()
            .get(self.i)
            .copied()
            .ok_or_else(|| self.error("unexpected end"))
    }

    fn expect(&mut self, byte: u8, what: &'static str) -> Result<()> {
        if self.peek()? != byte {
            return Err(self.error(what));
        }
        self.i += 1;
        Ok(())
    }

    /// Consumes a string whose opening quote is at `self.i`; returns its raw contents (between the
    /// quotes) and whether it has escapes.
    fn raw_string(&mut self) -> Result<(usize, usize, bool)> {
        let start = self.i + 1;
        let mut at = start;
        let mut escaped = false;
        loop {
            match find_any(self.bytes(), at, [b'"', b'\\']) {
                None => {
                    self.i = self.text.len();
                    return Err(self.error("unterminated string"));
                }
                Some(found) if self.bytes()[found] == b'\\' => {
                    escaped = true;
                    at = found + 2;
                }
                Some(found) => {
                    self.i = found + 1;
                    return Ok((start, found, escaped));
                }
            }
        }
    }

    /// A string value, decoded when it has escapes.
    fn string(&mut self) -> Result<Cow<'a, str>> {
        if self.peek()? != b'"' {
            return Err(self.error("expected a string"));
        }
        let (start, end, escaped) = self.raw_string()?;
        if !escaped {
            return std::str::from_utf8(&self.text[start..end])
                .map(Cow::Borrowed)
                .map_err(|e| PageError {
                    at: start + e.valid_up_to(),
                    what: "invalid UTF-8 in a string",
                });
        }
        serde_json::from_slice::<String>(&self.text[start - 1..=end])
            .map(Cow::Owned)
            .map_err(|_| PageError {
                at: start - 1,
                what: "invalid escape in a string",
            })
    }

    /// A field that should be a string: `null` leaves it unset.
    fn string_field(&mut self, into: &mut Option<Cow<'a, str>>) -> Result<()> {
        if self.peek()? == b'n' {
            return self.skip();
        }
        *into = Some(self.string()?);
        Ok(())
    }

    /// Skips one value of any kind.
    fn skip(&mut self) -> Result<()> {
        let (open, close) = match self.peek()? {
            b'"' => return self.raw_string().map(|_| ()),
            b'{' => (b'{', b'}'),
            b'[' => (b'[', b']'),
            _ => {
                // A number, true, false or null: up to the next delimiter.
                let start = self.i;
                while let Some(&b) = self.bytes().get(self.i) {
                    if matches!(b, b',' | b'}' | b']' | b' ' | b'\n' | b'\r' | b'\t') {
                        break;
                    }
                    self.i += 1;
                }
                if self.i == start {
                    return Err(self.error("expected a value"));
                }
                return Ok(());
            }
        };
        match container_end(self.text, self.i, open, close) {
            Some(end) => {
                self.i = end;
                Ok(())
            }
            None => self.walk_container(open, close),
        }
    }

    /// Skips the object or array opening at `self.i` string by string: the exact way, for what
    /// [`container_end`] cannot tell.
    fn walk_container(&mut self, open: u8, close: u8) -> Result<()> {
        // Within well-formed JSON, brackets of the other kind are balanced on their own, so counting
        // this kind (outside strings) finds the end.
        let mut depth = 0usize;
        while let Some(&b) = self.bytes().get(self.i) {
            if b == b'"' {
                self.raw_string()?;
                continue;
            }
            if b == open {
                depth += 1;
            } else if b == close {
                depth -= 1;
                if depth == 0 {
                    self.i += 1;
                    return Ok(());
                }
            }
            self.i += 1;
        }
        Err(self.error("unterminated object or array"))
    }

    /// An object: `field` is called with each raw key and must consume its value.
    fn object(&mut self, mut field: impl FnMut(&mut Self, &[u8]) -> Result<()>) -> Result<()> {
        self.expect(b'{', "expected an object")?;
        if self.peek()? == b'}' {
            self.i += 1;
            return Ok(());
        }
        loop {
            if self.peek()? != b'"' {
                return Err(self.error("expected a key"));
            }
            let (start, end, _) = self.raw_string()?;
            self.expect(b':', "expected ':' after a key")?;
            field(self, &self.bytes()[start..end])?;
            match self.peek()? {
                b',' => self.i += 1,
                b'}' => {
                    self.i += 1;
                    return Ok(());
                }
                _ => return Err(self.error("expected ',' or '}'")),
            }
        }
    }

    fn nullable_object(&mut self, field: impl FnMut(&mut Self, &[u8]) -> Result<()>) -> Result<()> {
        if self.peek()? == b'n' {
            return self.skip();
        }
        self.object(field)
    }

    /// An array (or `null`): `element` is called for each element and must consume it.
    fn nullable_array(&mut self, mut element: impl FnMut(&mut Self) -> Result<()>) -> Result<()> {
        if self.peek()? == b'n' {
            return self.skip();
        }
        self.expect(b'[', "expected an array")?;
        if self.peek()? == b']' {
            self.i += 1;
            return Ok(());
        }
        loop {
            element(self)?;
            match self.peek()? {
                b',' => self.i += 1,
                b']' => {
                    self.i += 1;
                    return Ok(());
                }
                _ => return Err(self.error("expected ',' or ']'")),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde::Deserialize;
    use std::collections::BTreeMap;

    fn objects(text: &str) -> Result<(PageMeta<'_>, Vec<Object<'_>>)> {
        let mut items = Vec::new();
        let meta = read(text.as_bytes(), |o| items.push(o))?;
        Ok((meta, items))
    }

    #[test]
    fn reads_names_versions_and_the_continue_token() {
        let text = r#"{"apiVersion":"meta.k8s.io/v1","kind":"PartialObjectMetadataList",
            "metadata":{"continue":"77/ns/b","resourceVersion":"77"},
            "items":[{"apiVersion":"meta.k8s.io/v1","kind":"PartialObjectMetadata",
                      "metadata":{"annotations":{"name":"not this","resourceVersion":"nor this",
                                                 "x":"{[\"}]"},
                                  "finalizers":["a/b"],"generation":1,"deletionGracePeriodSeconds":null,
                                  "name":"a","namespace":"ns","resourceVersion":"5",
                                  "ownerReferences":[{"name":"owner","controller":true}]}},
                     {"metadata":{"name":"b\u002dc","resourceVersion":"6"}}]}"#;
        let (meta, items) = objects(text).unwrap();
        assert_eq!(meta.resource_version.as_deref(), Some("77"));
        assert_eq!(meta.continue_token.as_deref(), Some("77/ns/b"));
        assert_eq!(items.len(), 2);
        assert_eq!(items[0].name.as_deref(), Some("a"));
        assert_eq!(items[0].namespace.as_deref(), Some("ns"));
        assert_eq!(items[0].resource_version.as_deref(), Some("5"));
        assert_eq!(items[1].name.as_deref(), Some("b-c"));
        assert_eq!(items[1].namespace, None);
    }

    #[test]
    fn empty_and_null_lists_are_fine() {
        assert_eq!(objects(r#"{"items":[]}"#).unwrap().1, vec![]);
        assert_eq!(
            objects(r#"{"items":null,"metadata":null}"#).unwrap().1,
            vec![]
        );
        assert_eq!(objects(" { } ").unwrap().0, PageMeta::default());
    }

    #[test]
    fn malformed_text_is_an_error_not_a_panic() {
        for bad in [
            "",
            "{",
            r#"{"items":[{"metadata":{"name":"a"}}"#,
            r#"{"items":[{"metadata":{"name":"a}}]}"#,
            r#"{"items":[{"metadata":{"name":"a\"#,
            r#"{"items":[{"metadata":{"name":}}]}"#,
            r#"{"items":[{"metadata":{"name" "a"}}]}"#,
            r#"{"items":[{"metadata":{"name":"a"}} {}]}"#,
            r#"{"items":{}}"#,
            r#"{"metadata":{"resourceVersion":5}}"#,
            r#"{"items":[]} x"#,
            r#"{"items":[{"metadata":{"name":"\x"}}]}"#,
        ] {
            let e = objects(bad).expect_err(bad);
            assert!(e.at <= bad.len(), "{bad}: {e}");
        }
    }

    /// What serde makes of the same text: the reference the scanner must agree with.
    #[derive(Deserialize)]
    struct RefPage {
        #[serde(default)]
        metadata: RefListMeta,
        #[serde(default)]
        items: Vec<RefItem>,
    }
    #[derive(Default, Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct RefListMeta {
        resource_version: Option<String>,
        #[serde(rename = "continue")]
        continue_token: Option<String>,
    }
    #[derive(Deserialize)]
    struct RefItem {
        #[serde(default)]
        metadata: RefMeta,
    }
    #[derive(Default, Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct RefMeta {
        namespace: Option<String>,
        name: Option<String>,
        resource_version: Option<String>,
    }

    fn any_text() -> impl Strategy<Value = String> {
        prop_oneof![
            "[a-z0-9.-]{0,12}",
            any::<String>(),
            Just("\"}]{[\\".to_string()),
            // Brackets inside a string with no escape in it.
            Just("}{][".to_string()),
        ]
    }

    fn any_item() -> impl Strategy<Value = serde_json::Value> {
        (
            proptest::option::of(any_text()),
            proptest::option::of(any_text()),
            proptest::option::of("[0-9]{1,8}"),
            proptest::collection::btree_map(any_text(), any_text(), 0..6),
            proptest::collection::vec(any::<i64>(), 0..3),
        )
            .prop_map(|(ns, name, rv, annotations, numbers)| {
                let mut meta = serde_json::Map::new();
                meta.insert("annotations".into(), serde_json::json!(annotations));
                meta.insert(
                    "labels".into(),
                    serde_json::json!(BTreeMap::from([("name", "label")])),
                );
                meta.insert("numbers".into(), serde_json::json!(numbers));
                meta.insert("deletionTimestamp".into(), serde_json::Value::Null);
                meta.insert("flag".into(), serde_json::json!(true));
                if let Some(ns) = ns {
                    meta.insert("namespace".into(), ns.into());
                }
                if let Some(name) = name {
                    meta.insert("name".into(), name.into());
                }
                if let Some(rv) = rv {
                    meta.insert("resourceVersion".into(), rv.into());
                }
                serde_json::json!({"kind": "PartialObjectMetadata", "metadata": meta,
                                   "extra": [[{"a": [1.5e3, -2]}], {}]})
            })
    }

    #[test]
    fn a_bracket_inside_a_string_does_not_end_a_skipped_value() {
        // Each of these has a bracket inside a string before its end, with and without escapes.
        let (_, items) = objects(
            r#"{"items":[{"metadata":{"annotations":{"a":"}"},"name":"x","resourceVersion":"1"}},
                         {"metadata":{"labels":{"a":"{}}","b":"\\"},"name":"y"}},
                         {"metadata":{"finalizers":["]","[["],"namespace":"z"}}]}"#,
        )
        .unwrap();
        let names: Vec<_> = items.iter().map(|o| o.name.as_deref()).collect();
        assert_eq!(names, [Some("x"), Some("y"), None]);
        assert_eq!(items[0].resource_version.as_deref(), Some("1"));
        assert_eq!(items[2].namespace.as_deref(), Some("z"));
    }

    proptest! {
        #[test]
        fn quotes_are_counted_right(text in proptest::collection::vec(
            proptest::sample::select(b"\"a".to_vec()), 0..100)) {
            let quotes = text.iter().filter(|&&b| b == b'"').count();
            prop_assert_eq!(odd_quotes(&text), quotes % 2 == 1);
        }
    }

    #[test]
    fn a_plain_value_ends_without_the_walk() {
        // Annotations, labels and owner references as an API server writes them: no escapes, so the
        // quick search must find the end itself (a `None` here would mean every page is walked).
        for value in [
            r#"{"ucloud.dk/jobStart":"1795334400000","ucloud.dk/user":"alice"} ,"name":"x"}"#,
            r#"[{"apiVersion":"batch.volcano.sh/v1alpha1","controller":true,"name":"j"}],"x":1}"#,
            r#"{"a":{"b":[1,{},"]"]},"c":"x"}]"#,
        ] {
            let text = value.as_bytes();
            let (open, close) = if text[0] == b'{' {
                (b'{', b'}')
            } else {
                (b'[', b']')
            };
            let mut exact = Scanner { text, i: 0 };
            exact.walk_container(open, close).unwrap();
            assert_eq!(
                container_end(text, 0, open, close),
                Some(exact.i),
                "{value}"
            );
        }
    }

    /// Text made of the characters that matter to finding a value's end, and a few that do not.
    fn any_soup() -> impl Strategy<Value = Vec<u8>> {
        proptest::collection::vec(proptest::sample::select(b"{}[]\"\\a:, ".to_vec()), 0..40)
    }

    proptest! {
        #[test]
        fn the_quick_end_of_a_value_is_the_exact_one_or_none(
            soup in any_soup(),
            object in any::<bool>(),
        ) {
            let (open, close) = if object { (b'{', b'}') } else { (b'[', b']') };
            let mut text = vec![open];
            text.extend(soup);
            if let Some(end) = container_end(&text, 0, open, close) {
                let mut exact = Scanner { text: &text, i: 0 };
                prop_assert_eq!(exact.walk_container(open, close), Ok(()));
                prop_assert_eq!(exact.i, end);
            }
        }

        #[test]
        fn agrees_with_serde_on_any_list(
            items in proptest::collection::vec(any_item(), 0..8),
            rv in proptest::option::of("[0-9]{1,8}"),
            token in proptest::option::of(any_text()),
            pretty in any::<bool>(),
        ) {
            let list = serde_json::json!({
                "apiVersion": "meta.k8s.io/v1",
                "metadata": {"resourceVersion": rv, "continue": token},
                "items": items,
            });
            let text = if pretty {
                serde_json::to_string_pretty(&list).unwrap()
            } else {
                serde_json::to_string(&list).unwrap()
            };
            let reference: RefPage = serde_json::from_str(&text).unwrap();
            let (meta, read) = objects(&text).unwrap();
            prop_assert_eq!(meta.resource_version.as_deref(), reference.metadata.resource_version.as_deref());
            prop_assert_eq!(meta.continue_token.as_deref(), reference.metadata.continue_token.as_deref());
            prop_assert_eq!(read.len(), reference.items.len());
            for (got, want) in read.iter().zip(&reference.items) {
                prop_assert_eq!(got.namespace.as_deref(), want.metadata.namespace.as_deref());
                prop_assert_eq!(got.name.as_deref(), want.metadata.name.as_deref());
                prop_assert_eq!(got.resource_version.as_deref(), want.metadata.resource_version.as_deref());
            }
        }
    }
}
