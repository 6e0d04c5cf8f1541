//! The `CLUSTER SLOTS` reply, read once for every use: its ranges of slots ([`SlotRange`]), each
//! with the nodes serving it ([`Node`], the master first), and each node's host and port.
//!
//! A range is `[start, end, master, replica…]`, a node `[host, port, id, metadata…]`: the
//! fields after the port (the node id, and in Redis 7 the hostname metadata, a flat array in
//! RESP2 and a map in RESP3) are not read, only compared ([`Node`]'s equality).

use std::borrow::Cow;

use redis::Value;

/// One range of a `CLUSTER SLOTS` reply: the slots `start..=end` (as the reply gives them,
/// unchecked) and the nodes serving them.
pub(crate) struct SlotRange<'a> {
    pub(crate) start: i64,
    pub(crate) end: i64,
    pub(crate) master: Node<'a>,
    /// A replica entry that is not an array is left out.
    pub(crate) replicas: Vec<Node<'a>>,
}

impl<'a> SlotRange<'a> {
    /// The master, then the replicas.
    pub(crate) fn nodes(&self) -> impl Iterator<Item = Node<'a>> + '_ {
        std::iter::once(self.master).chain(self.replicas.iter().copied())
    }
}

/// One node entry of a range. Two nodes are equal when their whole entries are (the node id
/// and metadata included), so the master of several ranges is found to be one node.
#[derive(Clone, Copy, PartialEq)]
pub(crate) struct Node<'a>(&'a [Value]);

/// The ranges of a `CLUSTER SLOTS` reply, `None` when the reply is not an array. A range that
/// is not an array, or whose start, end or master cannot be read (bounds that are not
/// integers, a master entry that is not an array), is left out.
pub(crate) fn ranges(reply: &Value) -> Option<impl Iterator<Item = SlotRange<'_>>> {
    let Value::Array(ranges) = reply else {
        return None;
    };
    Some(ranges.iter().filter_map(|range| {
        let Value::Array(fields) = range else {
            return None;
        };
        let (Some(Value::Int(start)), Some(Value::Int(end)), Some(Value::Array(master))) =
            (fields.first(), fields.get(1), fields.get(2))
        else {
            return None;
        };
        let replicas = fields
            .iter()
            .skip(3)
            .filter_map(|node| match node {
                Value::Array(node) => Some(Node(node)),
                _ => None,
            })
            .collect();
        Some(SlotRange {
            start: *start,
            end: *end,
            master: Node(master),
            replicas,
        })
    }))
}

/// Each master of a `CLUSTER SLOTS` reply once, with the first slot it serves (a range whose
/// start is not a slot number is left out); empty when the reply is not an array.
pub(crate) fn masters(reply: &Value) -> Vec<(u16, Node<'_>)> {
    let mut masters: Vec<(u16, Node<'_>)> = Vec::new();
    for range in ranges(reply).into_iter().flatten() {
        if let (Ok(slot), false) = (
            u16::try_from(range.start),
            masters.iter().any(|(_, master)| *master == range.master),
        ) {
            masters.push((slot, range.master));
        }
    }
    masters
}

impl<'a> Node<'a> {
    /// The node's id (the field after the port, Redis 4 and later); `None` without one.
    pub(crate) fn id(&self) -> Option<Cow<'a, str>> {
        match self.0.get(2) {
            Some(Value::BulkString(bytes)) => Some(String::from_utf8_lossy(bytes)),
            Some(Value::SimpleString(text)) => Some(Cow::Borrowed(text.as_str())),
            _ => None,
        }
    }

    /// The host the node is reached at; `None` when the reply leaves it to the address that
    /// was asked (an empty host, `?`, nil) or gives no text.
    pub(crate) fn host(&self) -> Option<Cow<'a, str>> {
        let host = match self.0.first() {
            Some(Value::BulkString(bytes)) => String::from_utf8_lossy(bytes),
            Some(Value::SimpleString(text)) => Cow::Borrowed(text.as_str()),
            _ => return None,
        };
        (!host.is_empty() && host != "?").then_some(host)
    }

    /// The node's port; `None` when it is not an integer from 1 to 65535.
    pub(crate) fn port(&self) -> Option<u16> {
        match self.0.get(1) {
            Some(Value::Int(port)) => u16::try_from(*port).ok().filter(|&port| port != 0),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(text: &str) -> Value {
        Value::BulkString(text.as_bytes().to_vec())
    }

    /// A node entry as Redis 7 sends it in RESP2: host, port, id, then metadata as an array.
    fn node(host: &str, port: i64, id: &str) -> Value {
        Value::Array(vec![
            bulk(host),
            Value::Int(port),
            bulk(id),
            Value::Array(vec![bulk("hostname"), bulk("")]),
        ])
    }

    fn range(start: i64, end: i64, nodes: Vec<Value>) -> Value {
        let mut fields = vec![Value::Int(start), Value::Int(end)];
        fields.extend(nodes);
        Value::Array(fields)
    }

    /// A node's host and port, as read.
    type Address = (Option<String>, Option<u16>);

    /// Each range's bounds, and each node's host and port.
    fn read(reply: &Value) -> Option<Vec<(i64, i64, Vec<Address>)>> {
        let ranges = ranges(reply)?;
        Some(
            ranges
                .map(|r| {
                    let nodes = r.nodes();
                    let nodes = nodes.map(|n| (n.host().map(Cow::into_owned), n.port()));
                    (r.start, r.end, nodes.collect())
                })
                .collect(),
        )
    }

    fn known(host: &str, port: u16) -> Address {
        (Some(host.to_owned()), Some(port))
    }

    #[test]
    fn a_normal_reply_gives_each_range_with_its_master_then_replicas() {
        let reply = Value::Array(vec![
            range(
                0,
                5460,
                vec![node("10.0.0.1", 7000, "a"), node("10.0.0.4", 7003, "d")],
            ),
            range(5461, 16383, vec![node("10.0.0.2", 7001, "b")]),
        ]);
        assert_eq!(
            read(&reply),
            Some(vec![
                (
                    0,
                    5460,
                    vec![known("10.0.0.1", 7000), known("10.0.0.4", 7003)]
                ),
                (5461, 16383, vec![known("10.0.0.2", 7001)]),
            ])
        );
    }

    #[test]
    fn a_range_without_replicas_has_its_master_only() {
        let reply = Value::Array(vec![range(0, 16383, vec![node("h", 7000, "a")])]);
        assert_eq!(read(&reply), Some(vec![(0, 16383, vec![known("h", 7000)])]));
    }

    #[test]
    fn an_empty_host_a_question_mark_or_nil_is_the_address_that_was_asked() {
        let nil_host = Value::Array(vec![Value::Nil, Value::Int(7002), bulk("c")]);
        let reply = Value::Array(vec![range(
            0,
            16383,
            vec![node("", 7000, "a"), node("?", 7001, "b"), nil_host],
        )]);
        let unknown = |port| (None, Some(port));
        assert_eq!(
            read(&reply),
            Some(vec![(
                0,
                16383,
                vec![unknown(7000), unknown(7001), unknown(7002)]
            )])
        );
    }

    #[test]
    fn a_port_outside_1_to_65535_or_not_an_integer_is_unknown() {
        let text_port = Value::Array(vec![bulk("h"), bulk("7000")]);
        let nodes = vec![node("h", 0, "a"), node("h", 65536, "b"), text_port];
        let reply = Value::Array(vec![range(0, 1, nodes)]);
        let no_port = (Some("h".to_owned()), None);
        assert_eq!(
            read(&reply),
            Some(vec![(
                0,
                1,
                vec![no_port.clone(), no_port.clone(), no_port]
            )])
        );
    }

    #[test]
    fn malformed_ranges_are_left_out_and_a_malformed_replica_is_skipped() {
        let reply = Value::Array(vec![
            bulk("not a range"),
            // Bounds that are not integers, a master that is not an array, no master.
            Value::Array(vec![bulk("0"), Value::Int(9), node("a", 1, "a")]),
            Value::Array(vec![Value::Int(0), Value::Nil, node("b", 2, "b")]),
            range(0, 9, vec![bulk("c:3")]),
            range(0, 9, Vec::new()),
            // A replica entry that is not an array: the range stays, without it.
            range(
                10,
                19,
                vec![node("d", 4, "d"), Value::Nil, node("e", 5, "e")],
            ),
        ]);
        assert_eq!(
            read(&reply),
            Some(vec![(10, 19, vec![known("d", 4), known("e", 5)])])
        );
        assert!(read(&Value::Nil).is_none());
        assert_eq!(read(&Value::Array(Vec::new())), Some(Vec::new()));
    }

    #[test]
    fn resp3_shapes_read_as_resp2_ones() {
        // RESP3: the metadata is a map; a host may come as a simple string.
        let resp3 = Value::Array(vec![
            Value::SimpleString("h".to_owned()),
            Value::Int(7000),
            bulk("a"),
            Value::Map(vec![(bulk("hostname"), bulk(""))]),
        ]);
        let reply = Value::Array(vec![range(0, 16383, vec![resp3, node("h", 7001, "b")])]);
        assert_eq!(
            read(&reply),
            Some(vec![(0, 16383, vec![known("h", 7000), known("h", 7001)])])
        );
    }

    #[test]
    fn nodes_are_equal_when_their_whole_entries_are() {
        let reply = Value::Array(vec![
            range(0, 9, vec![node("h", 7000, "a")]),
            range(10, 19, vec![node("h", 7000, "a")]),
            range(20, 29, vec![node("h", 7000, "other id")]),
        ]);
        let masters: Vec<Node<'_>> = ranges(&reply).unwrap().map(|r| r.master).collect();
        assert!(masters[0] == masters[1]);
        assert!(masters[0] != masters[2]);
    }
}
