//! A minimal AMQP 0-9-1 publisher over plain TCP, for what lapin cannot send: short strings (the `type`,
//! `message_id`, `reply_to` properties, header names, routing keys) that are not UTF-8. RabbitMQ accepts
//! and passes them on; consumers must survive them.
//!
//! It does the handshake (PLAIN login), opens one channel in confirm mode and publishes frames encoded by
//! hand, waiting for each publisher confirm. Nothing else of the protocol is spoken.

#![allow(dead_code)]

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use volcano_runner::broker::sanitize::encode::{self, RawProperties};

/// One open connection with channel 1 in confirm mode.
pub struct RawPublisher {
    stream: TcpStream,
    next_tag: u64,
}

/// A frame read from the server: type, channel, payload.
struct Frame {
    kind: u8,
    payload: Vec<u8>,
}

impl Frame {
    fn method(&self) -> Option<(u16, u16)> {
        (self.kind == 1 && self.payload.len() >= 4).then(|| {
            (
                u16::from_be_bytes([self.payload[0], self.payload[1]]),
                u16::from_be_bytes([self.payload[2], self.payload[3]]),
            )
        })
    }
}

impl RawPublisher {
    /// Connects to RabbitMQ at `127.0.0.1:5672` as guest into `vhost`.
    pub async fn connect(vhost: &str) -> Self {
        let stream = TcpStream::connect("127.0.0.1:5672")
            .await
            .expect("RabbitMQ at 127.0.0.1:5672");
        let mut p = Self {
            stream,
            next_tag: 1,
        };
        p.stream.write_all(b"AMQP\x00\x00\x09\x01").await.unwrap();
        p.expect(10, 10).await; // connection.start
        let mut args = Vec::new();
        args.extend_from_slice(&0u32.to_be_bytes()); // client properties: empty table
        encode::short_str(&mut args, b"PLAIN");
        let response = b"\0guest\0guest";
        args.extend_from_slice(&(response.len() as u32).to_be_bytes());
        args.extend_from_slice(response);
        encode::short_str(&mut args, b"en_US");
        p.send(&encode::method(0, 10, 11, &args)).await;
        let tune = p.expect(10, 30).await; // connection.tune: channel_max, frame_max, heartbeat
        let mut args = tune.payload[4..10].to_vec();
        args.extend_from_slice(&0u16.to_be_bytes()); // no heartbeats
        p.send(&encode::method(0, 10, 31, &args)).await;
        let mut args = Vec::new();
        encode::short_str(&mut args, vhost.as_bytes());
        encode::short_str(&mut args, b"");
        args.push(0);
        p.send(&encode::method(0, 10, 40, &args)).await;
        p.expect(10, 41).await;
        p.send(&encode::method(1, 20, 10, b"\x00")).await; // channel.open
        p.expect(20, 11).await;
        p.send(&encode::method(1, 85, 10, b"\x00")).await; // confirm.select
        p.expect(85, 11).await;
        p
    }

    async fn send(&mut self, bytes: &[u8]) {
        self.stream
            .write_all(bytes)
            .await
            .expect("write to RabbitMQ");
    }

    async fn read_frame(&mut self) -> Frame {
        let mut head = [0u8; 7];
        self.stream.read_exact(&mut head).await.expect("a frame");
        let size = u32::from_be_bytes([head[3], head[4], head[5], head[6]]) as usize;
        let mut payload = vec![0u8; size + 1];
        self.stream.read_exact(&mut payload).await.expect("a frame");
        assert_eq!(payload.pop(), Some(0xCE), "frame end");
        Frame {
            kind: head[0],
            payload,
        }
    }

    /// The next method frame, which must be `class.method` (a close is reported with its text).
    async fn expect(&mut self, class: u16, method: u16) -> Frame {
        let frame = tokio::time::timeout(Duration::from_secs(10), async {
            loop {
                let frame = self.read_frame().await;
                if frame.kind == 8 {
                    continue;
                }
                return frame;
            }
        })
        .await
        .expect("RabbitMQ answers");
        match frame.method() {
            Some(m) if m == (class, method) => frame,
            Some((10, 50)) | Some((20, 40)) => panic!(
                "RabbitMQ closed: {}",
                String::from_utf8_lossy(&frame.payload[6..])
            ),
            other => panic!("expected {class}.{method}, got {other:?}"),
        }
    }

    /// Publishes `body` to `exchange` with `routing_key` and the properties as raw bytes; waits for the
    /// broker's confirm.
    pub async fn publish(
        &mut self,
        exchange: &str,
        routing_key: &[u8],
        properties: &RawProperties,
        body: &[u8],
    ) {
        let mut args = Vec::new();
        args.extend_from_slice(&0u16.to_be_bytes());
        encode::short_str(&mut args, exchange.as_bytes());
        encode::short_str(&mut args, routing_key);
        args.push(0);
        let mut bytes = encode::method(1, 60, 40, &args);
        bytes.extend(encode::content_header(1, body.len() as u64, properties));
        bytes.extend(encode::frame(3, 1, body));
        self.send(&bytes).await;
        let ack = self.expect(60, 80).await;
        let tag = u64::from_be_bytes(ack.payload[4..12].try_into().unwrap());
        assert_eq!(tag, self.next_tag, "the confirm of this message");
        self.next_tag += 1;
    }

    pub async fn close(mut self) {
        let mut args = Vec::new();
        args.extend_from_slice(&200u16.to_be_bytes());
        encode::short_str(&mut args, b"bye");
        args.extend_from_slice(&[0, 0, 0, 0]);
        self.send(&encode::method(0, 10, 50, &args)).await;
        let _ = tokio::time::timeout(Duration::from_secs(5), self.expect(10, 51)).await;
    }
}
