//! The `ringlog` command line: topic and consumer group administration,
//! producing stdin lines and consuming records to stdout (alone or as a
//! member of a group). The composition root of the CLI: parses flags, builds
//! one client component, runs one command, exits non-zero with the reason on
//! any failure.

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{anyhow, bail, Context};
use bytes::Bytes;
use clap::{Parser, Subcommand, ValueEnum};
use client::messages;
use client::{
    Acks, Admin, ClientConfig, Cluster, Compression, Consumer, ConsumerConfig, ConsumerRecord,
    DeliveryFuture, GroupConfig, GroupConsumer, GroupDescription, IsolationLevel, OffsetReset,
    Producer, ProducerConfig, ProducerRecord, ResetTo, SeekTo,
};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader, BufWriter};
use tokio::sync::mpsc;

/// Writes the command's output to stdout. A reader that went away
/// (`ringlog topic describe | head`) ends the command quietly, as it ends
/// any Unix tool, where `print!` would panic.
fn write_stdout(text: std::fmt::Arguments<'_>) {
    use std::io::Write as _;
    if let Err(error) = std::io::stdout().lock().write_fmt(text) {
        if error.kind() == std::io::ErrorKind::BrokenPipe {
            std::process::exit(0);
        }
        eprintln!("ringlog: writing to stdout: {error}");
        std::process::exit(1);
    }
}

/// `println!` through [`write_stdout`].
macro_rules! say {
    ($($arg:tt)*) => {
        write_stdout(format_args!("{}\n", format_args!($($arg)*)))
    };
}

/// `print!` through [`write_stdout`].
macro_rules! say_raw {
    ($($arg:tt)*) => {
        write_stdout(format_args!($($arg)*))
    };
}

/// The reader of the streamed output (`consume`) went away: the command
/// ends quietly, with success.
#[derive(Debug, thiserror::Error)]
#[error("the reader of the output went away")]
struct OutputClosed;

fn output_error(error: std::io::Error) -> anyhow::Error {
    if error.kind() == std::io::ErrorKind::BrokenPipe {
        OutputClosed.into()
    } else {
        anyhow::Error::new(error).context("writing to stdout")
    }
}

/// Bound on record futures the producer command holds before it waits for
/// the oldest; memory stays flat on unbounded input.
const PENDING_DELIVERIES_MAX: usize = 65_536;
/// Bound on one stdin line (one record).
const LINE_BYTES_MAX: usize = 1 << 20;
/// How long one consumer poll waits before the loop checks its stop conditions.
const POLL_TIMEOUT_MS: u64 = 500;

#[derive(Parser, Debug)]
#[command(name = "ringlog", version, about = "Ringlog command line client")]
struct Cli {
    /// A broker to bootstrap from, HOST:PORT (comma-separated for several).
    #[arg(long, global = true, default_value = "127.0.0.1:9092")]
    bootstrap: String,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Create, list, describe or delete topics.
    #[command(subcommand)]
    Topic(TopicCommand),
    /// Produce one record per stdin line.
    Produce(ProduceArgs),
    /// Print records of a topic.
    Consume(ConsumeArgs),
    /// The controller quorum and the brokers it knows.
    #[command(subcommand)]
    Cluster(ClusterCommand),
    /// List, describe, reset or delete consumer groups.
    #[command(subcommand)]
    Group(GroupCommand),
    /// List or describe transactional ids and their transactions.
    #[command(subcommand)]
    Transaction(TransactionCommand),
}

#[derive(Subcommand, Debug)]
enum TransactionCommand {
    /// Every transactional id of the cluster: id, state, producer id and
    /// epoch, partitions in the open transaction.
    List {
        /// Only ids in this state (Empty, Ongoing, PrepareCommit,
        /// PrepareAbort, CompleteCommit, CompleteAbort); repeatable.
        #[arg(long = "state")]
        states: Vec<String>,
    },
    /// One id: state, producer id and epoch, timeout, when the open
    /// transaction began and its partitions.
    Describe { transactional_id: String },
}

#[derive(Subcommand, Debug)]
enum GroupCommand {
    /// Every group of the cluster: id, state and member count.
    List,
    /// One row per partition (topic, partition, owner, committed offset, log
    /// end offset, lag in records and in seconds), then one per member.
    Describe { group: String },
    /// Moves the group's committed offsets of a topic; the group must have no
    /// members. Prints partition, old and new offset.
    Reset {
        group: String,
        #[arg(long)]
        topic: String,
        /// earliest, latest, an offset, @TIMESTAMP_MS, or -DURATION back from
        /// now (-30s, -10m, -1h, -2d).
        #[arg(long, allow_hyphen_values = true, value_parser = ResetTo::parse)]
        to: ResetTo,
        /// Print the new offsets without committing them.
        #[arg(long)]
        dry_run: bool,
    },
    /// Deletes a group without members and its committed offsets.
    Delete { group: String },
    /// Deletes a group's committed offsets of one topic, which no member may
    /// subscribe to.
    DeleteOffsets {
        group: String,
        #[arg(long)]
        topic: String,
    },
}

#[derive(Subcommand, Debug)]
enum ClusterCommand {
    /// Controllers (id, endpoint, leader, Raft term) and brokers (id,
    /// endpoints, alive or fenced, partitions led), from the first reachable
    /// controller.
    Describe {
        /// Controller endpoints, HOST:PORT, comma-separated.
        #[arg(long, required = true)]
        controller: String,
    },
}

#[derive(Subcommand, Debug)]
enum TopicCommand {
    Create {
        name: String,
        #[arg(long)]
        partitions: i32,
        #[arg(long, default_value_t = 1)]
        replication_factor: i16,
        /// key=value, repeatable: cleanup.policy, retention.ms,
        /// retention.bytes, segment.bytes, segment.ms, flush.policy
        /// (always|none|interval_ms:N), ... (docs/config.md).
        #[arg(long = "config", value_parser = parse_key_value)]
        configs: Vec<(String, String)>,
    },
    /// Changes a topic's settings; `topic describe` shows the result.
    Alter {
        name: String,
        /// key=value to set, repeatable.
        #[arg(long = "config", value_parser = parse_key_value)]
        configs: Vec<(String, String)>,
        /// A key to remove (back to the broker default), repeatable.
        #[arg(long = "delete-config")]
        delete_configs: Vec<String>,
    },
    List,
    Describe {
        name: String,
    },
    Delete {
        name: String,
    },
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum AcksArg {
    #[value(name = "0")]
    Zero,
    #[value(name = "1")]
    One,
    #[value(name = "all", alias = "-1")]
    All,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum IsolationArg {
    ReadCommitted,
    ReadUncommitted,
}

impl IsolationArg {
    fn level(self) -> IsolationLevel {
        match self {
            IsolationArg::ReadCommitted => IsolationLevel::ReadCommitted,
            IsolationArg::ReadUncommitted => IsolationLevel::ReadUncommitted,
        }
    }
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum CompressionArg {
    None,
    Zstd,
}

#[derive(clap::Args, Debug)]
struct ProduceArgs {
    topic: String,
    /// Split each line at the first SEP into key and value.
    #[arg(long)]
    key_separator: Option<String>,
    #[arg(long, value_enum, default_value = "all")]
    acks: AcksArg,
    #[arg(long, value_enum, default_value = "none")]
    compression: CompressionArg,
    /// Send every line as a tombstone: the line (its key part with
    /// --key-separator) is the key and the value is null.
    #[arg(long)]
    null_value: bool,
    /// A value exactly equal to this text is sent as null (a tombstone).
    #[arg(long)]
    null_marker: Option<String>,
}

#[derive(clap::Args, Debug)]
struct ConsumeArgs {
    topic: String,
    /// Only this partition (default: all).
    #[arg(long)]
    partition: Option<i32>,
    /// earliest, latest, an offset, or @TIMESTAMP_MS. With --group, where
    /// partitions without a committed offset start: earliest or latest.
    #[arg(long, default_value = "earliest", value_parser = parse_from)]
    from: SeekTo,
    /// Read as a member of this consumer group: the group's coordinator
    /// assigns the partitions, and what is printed is committed as it goes
    /// (every 5 s) and on exit (the limit, the end, SIGINT or SIGTERM),
    /// before leaving the group.
    #[arg(long, conflicts_with = "partition")]
    group: Option<String>,
    /// With --group: a static member id (group.instance.id).
    #[arg(long, requires = "group")]
    instance_id: Option<String>,
    /// With --group: the session timeout in ms (default 45 000).
    #[arg(long, requires = "group")]
    session_timeout_ms: Option<u32>,
    /// With --group: how often what was printed is committed, in ms
    /// (default 5 000).
    #[arg(long, requires = "group")]
    commit_interval_ms: Option<u64>,
    /// Stop after this many records.
    #[arg(long)]
    count: Option<u64>,
    /// Stop once every partition is read up to its end offset at start
    /// (with --group: every partition this member owns, once it owns one).
    #[arg(long)]
    until_end: bool,
    /// Template with {partition} {offset} {timestamp} {key} {value}; \n and \t escapes.
    #[arg(long)]
    format: Option<String>,
    /// How a null key or value (a tombstone) is shown, so it differs from an
    /// empty one.
    #[arg(long, default_value = "<null>")]
    null_text: String,
    /// read-committed: records of committed transactions and plain records
    /// only, up to the last stable offset; read-uncommitted: every record
    /// below the high watermark, open and aborted transactions included.
    #[arg(long, value_enum, default_value = "read-committed")]
    isolation: IsolationArg,
}

fn parse_key_value(s: &str) -> Result<(String, String), String> {
    let (key, value) = s
        .split_once('=')
        .ok_or_else(|| format!("`{s}` is not key=value"))?;
    if key.is_empty() {
        return Err(format!("`{s}` has an empty key"));
    }
    Ok((key.to_owned(), value.to_owned()))
}

fn parse_from(s: &str) -> Result<SeekTo, String> {
    match s {
        "earliest" => Ok(SeekTo::Earliest),
        "latest" => Ok(SeekTo::Latest),
        _ => {
            if let Some(ts) = s.strip_prefix('@') {
                ts.parse()
                    .map(SeekTo::Timestamp)
                    .map_err(|_| format!("`{s}` is not @TIMESTAMP_MS"))
            } else {
                match s.parse::<i64>() {
                    Ok(offset) if offset >= 0 => Ok(SeekTo::Offset(offset)),
                    _ => Err(format!(
                        "`{s}` is not earliest, latest, an offset or @TIMESTAMP_MS"
                    )),
                }
            }
        }
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("ringlog: cannot start the runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        // `ringlog consume ... | head`.
        Err(error) if error.downcast_ref::<OutputClosed>().is_some() => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("ringlog: {error:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    if let Command::Cluster(ClusterCommand::Describe { controller }) = &cli.command {
        return describe_cluster(controller).await;
    }
    let cluster = Cluster::connect(&cli.bootstrap, ClientConfig::default())
        .await
        .with_context(|| format!("bootstrapping from {}", cli.bootstrap))?;
    match cli.command {
        Command::Topic(command) => topic(Admin::from_cluster(cluster), command).await,
        Command::Produce(args) => produce(cluster, args).await,
        Command::Consume(args) => match args.group.clone() {
            Some(group) => consume_group(cluster, args, group).await,
            None => consume(cluster, args).await,
        },
        Command::Group(command) => group(Admin::from_cluster(cluster), command).await,
        Command::Transaction(command) => transaction(Admin::from_cluster(cluster), command).await,
        Command::Cluster(_) => unreachable!("answered above"),
    }
}

/// Asks each controller in turn until one answers, then prints what it knows.
async fn describe_cluster(controllers: &str) -> anyhow::Result<()> {
    let config = ClientConfig::default();
    let mut last_error = None;
    for address in controllers
        .split(',')
        .map(str::trim)
        .filter(|a| !a.is_empty())
    {
        let answer = async {
            let connection = client::Connection::connect(address, &config).await?;
            let response = connection
                .request_controller(
                    protocol::api::ControllerApiKey::DescribeCluster,
                    &messages::describe_cluster_request(),
                )
                .await?;
            messages::describe_cluster_response(response.body())
        }
        .await;
        match answer {
            Ok(description) => {
                say_raw!("{}", render_cluster(&description));
                return Ok(());
            }
            Err(e) => last_error = Some(anyhow::anyhow!("{address}: {e}")),
        }
    }
    Err(last_error.unwrap_or_else(|| anyhow::anyhow!("no controller endpoint given")))
}

fn render_cluster(d: &messages::ClusterDescription) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let leader = d.leader_id.map_or("none".to_owned(), |id| id.to_string());
    let _ = writeln!(
        out,
        "answered by controller {}; leader {leader}; raft term {}; metadata version {}",
        d.node_id, d.raft_term, d.metadata_version
    );
    let _ = writeln!(out, "controller\tendpoint\trole");
    for c in &d.controllers {
        let _ = writeln!(
            out,
            "{}\t{}\t{}",
            c.id,
            c.endpoint,
            if c.is_leader { "leader" } else { "follower" }
        );
    }
    let _ = writeln!(
        out,
        "broker\tepoch\tstate\tpartitions_led\tendpoint\tshard_endpoints"
    );
    for b in &d.brokers {
        let state = if b.fenced { "fenced" } else { "alive" };
        let _ = writeln!(
            out,
            "{}\t{}\t{state}\t{}\t{}\t{}",
            b.id,
            b.epoch,
            b.partitions_led,
            b.client_endpoint,
            b.shard_endpoints.join(",")
        );
    }
    out
}

async fn topic(admin: Admin, command: TopicCommand) -> anyhow::Result<()> {
    match command {
        TopicCommand::Create {
            name,
            partitions,
            replication_factor,
            configs,
        } => {
            admin
                .create_topic(&name, partitions, replication_factor, &configs)
                .await
                .with_context(|| format!("creating topic `{name}`"))?;
            say!("created topic {name} with {partitions} partitions");
        }
        TopicCommand::Alter {
            name,
            configs,
            delete_configs,
        } => {
            if configs.is_empty() && delete_configs.is_empty() {
                bail!("nothing to change: give --config KEY=VALUE or --delete-config KEY");
            }
            admin
                .alter_topic_config(&name, &configs, &delete_configs)
                .await
                .with_context(|| format!("altering topic `{name}`"))?;
            say!("altered topic {name}");
        }
        TopicCommand::List => {
            for topic in admin.list_topics().await.context("listing topics")? {
                say!(
                    "{}\tpartitions={}\treplication_factor={}",
                    topic.name,
                    topic.partitions,
                    topic.replication_factor
                );
            }
        }
        TopicCommand::Describe { name } => {
            let description = admin
                .describe_topic(&name)
                .await
                .with_context(|| format!("describing topic `{name}`"))?;
            say!(
                "topic {}\tpartitions={}\treplication_factor={}",
                description.name,
                description.partition_count,
                description.replication_factor
            );
            for (key, value) in &description.configs {
                say!("config {key}={value}");
            }
            say!("partition\tleader\tepoch\tshard\tlog_start\tlog_end\tsize_bytes");
            for p in &description.partitions {
                let error = if p.error.is_ok() {
                    String::new()
                } else {
                    format!("\t{}", p.error)
                };
                say!(
                    "{}\t{}\t{}\t{}\t{}\t{}\t{}{error}",
                    p.partition,
                    p.leader,
                    p.leader_epoch,
                    p.shard,
                    p.log_start_offset,
                    p.log_end_offset,
                    p.size_bytes
                );
            }
        }
        TopicCommand::Delete { name } => {
            admin
                .delete_topic(&name)
                .await
                .with_context(|| format!("deleting topic `{name}`"))?;
            say!("deleted topic {name}");
        }
    }
    Ok(())
}

async fn produce(cluster: Cluster, args: ProduceArgs) -> anyhow::Result<()> {
    let config = ProducerConfig {
        acks: match args.acks {
            AcksArg::Zero => Acks::None,
            AcksArg::One => Acks::Leader,
            AcksArg::All => Acks::All,
        },
        compression: match args.compression {
            CompressionArg::None => Compression::None,
            CompressionArg::Zstd => Compression::Zstd,
        },
        ..ProducerConfig::default()
    };
    let producer = Producer::new(cluster, config)?;
    // Deliveries are awaited in order by a separate task so that reading
    // stdin never waits for acknowledgements, only for buffer space.
    let (deliveries, mut deliveries_rx) = mpsc::channel::<DeliveryFuture>(PENDING_DELIVERIES_MAX);
    let collector = tokio::spawn(async move {
        let mut delivered = 0u64;
        let mut first_error = None;
        while let Some(delivery) = deliveries_rx.recv().await {
            match delivery.await {
                Ok(_) => delivered += 1,
                Err(error) => {
                    first_error.get_or_insert(error);
                }
            }
        }
        (delivered, first_error)
    });
    let read_result = read_and_enqueue(&producer, &args, &deliveries).await;
    drop(deliveries);
    producer.close().await?;
    let (delivered, first_error) = collector.await.context("delivery collector")?;
    let records = read_result?;
    if let Some(error) = first_error {
        bail!(
            "{} of {records} records not acknowledged; first failure: {error}",
            records - delivered
        );
    }
    if delivered != records {
        bail!("{delivered} of {records} records acknowledged");
    }
    Ok(())
}

/// Reads stdin line by line and enqueues one record per line; returns the count.
async fn read_and_enqueue(
    producer: &Producer,
    args: &ProduceArgs,
    deliveries: &mpsc::Sender<DeliveryFuture>,
) -> anyhow::Result<u64> {
    let mut stdin = BufReader::new(tokio::io::stdin());
    let mut line = Vec::new();
    let mut records = 0u64;
    loop {
        line.clear();
        let read = (&mut stdin)
            .take(LINE_BYTES_MAX as u64 + 1)
            .read_until(b'\n', &mut line)
            .await
            .context("reading stdin")?;
        if read == 0 {
            return Ok(records);
        }
        if line.last() == Some(&b'\n') {
            line.pop();
            if line.last() == Some(&b'\r') {
                line.pop();
            }
        } else if line.len() > LINE_BYTES_MAX {
            bail!("line {} is longer than {LINE_BYTES_MAX} bytes", records + 1);
        }
        let (key, value) = if args.null_value {
            let (key, value) = split_key(&line, args.key_separator.as_deref());
            (Some(key.unwrap_or(value)), None)
        } else {
            let (key, value) = split_key(&line, args.key_separator.as_deref());
            let tombstone = args
                .null_marker
                .as_deref()
                .is_some_and(|marker| value[..] == *marker.as_bytes());
            (key, (!tombstone).then_some(value))
        };
        let record = ProducerRecord {
            topic: args.topic.clone(),
            key,
            value,
            ..ProducerRecord::default()
        };
        let delivery = producer
            .enqueue(record)
            .await
            .with_context(|| format!("producing line {}", records + 1))?;
        records += 1;
        deliveries
            .send(delivery)
            .await
            .map_err(|_| anyhow!("delivery collector stopped"))?;
    }
}

fn split_key(line: &[u8], separator: Option<&str>) -> (Option<Bytes>, Bytes) {
    let Some(separator) = separator.map(str::as_bytes).filter(|s| !s.is_empty()) else {
        return (None, Bytes::copy_from_slice(line));
    };
    match line
        .windows(separator.len())
        .position(|window| window == separator)
    {
        Some(at) => (
            Some(Bytes::copy_from_slice(&line[..at])),
            Bytes::copy_from_slice(&line[at + separator.len()..]),
        ),
        None => (None, Bytes::copy_from_slice(line)),
    }
}

async fn consume(cluster: Cluster, args: ConsumeArgs) -> anyhow::Result<()> {
    let config = ConsumerConfig {
        isolation_level: args.isolation.level(),
        ..ConsumerConfig::default()
    };
    let mut consumer = Consumer::new(cluster, config)?;
    let only = args.partition.map(|p| [p]);
    let partitions = consumer
        .assign(&args.topic, only.as_ref().map(|p| &p[..]))
        .await
        .with_context(|| format!("assigning topic `{}`", args.topic))?;
    for &p in &partitions {
        consumer.seek(&args.topic, p, args.from).await?;
    }
    // Partitions still to read up to their end offset at start.
    let mut ends: Option<BTreeMap<i32, i64>> = None;
    if args.until_end {
        let mut end_offsets = consumer.end_offsets(&args.topic, &partitions).await?;
        end_offsets.retain(|p, end| {
            consumer
                .position(&args.topic, *p)
                .is_some_and(|pos| pos < *end)
        });
        ends = Some(end_offsets);
    }
    let template = Template::parse(args.format.as_deref().unwrap_or("{value}"), &args.null_text);
    let mut out = BufWriter::new(tokio::io::stdout());
    let mut printed = 0u64;
    loop {
        if args.count.is_some_and(|count| printed >= count)
            || ends.as_ref().is_some_and(BTreeMap::is_empty)
        {
            break;
        }
        let records = consumer
            .poll(Duration::from_millis(POLL_TIMEOUT_MS))
            .await?;
        for record in &records {
            if let Some(ends) = &ends {
                if ends
                    .get(&record.partition)
                    .is_none_or(|end| record.offset >= *end)
                {
                    continue;
                }
            }
            if args.count.is_some_and(|count| printed >= count) {
                break;
            }
            let line = template.render(record);
            out.write_all(&line).await.map_err(output_error)?;
            out.write_all(b"\n").await.map_err(output_error)?;
            printed += 1;
        }
        out.flush().await.map_err(output_error)?;
        if let Some(ends) = &mut ends {
            ends.retain(|p, end| {
                consumer
                    .position(&args.topic, *p)
                    .is_some_and(|pos| pos < *end)
            });
        }
    }
    out.flush().await.map_err(output_error)?;
    Ok(())
}

async fn group(admin: Admin, command: GroupCommand) -> anyhow::Result<()> {
    match command {
        GroupCommand::List => {
            for group in admin.list_groups().await.context("listing groups")? {
                say!(
                    "{}\tstate={}\tmembers={}",
                    group.group_id,
                    group.state,
                    group.members
                );
            }
        }
        GroupCommand::Describe { group } => {
            let description = admin
                .describe_group(&group)
                .await
                .with_context(|| format!("describing group `{group}`"))?;
            say_raw!("{}", render_group(&description));
        }
        GroupCommand::Reset {
            group,
            topic,
            to,
            dry_run,
        } => {
            let resets = admin
                .reset_offsets(&group, &topic, to, dry_run)
                .await
                .with_context(|| format!("resetting group `{group}` on topic `{topic}`"))?;
            say!("partition\told\tnew");
            for reset in &resets {
                say!(
                    "{}\t{}\t{}",
                    reset.partition,
                    or_dash(reset.old_offset),
                    reset.new_offset
                );
            }
            if dry_run {
                eprintln!("dry run: nothing committed");
            }
        }
        GroupCommand::Delete { group } => {
            admin
                .delete_group(&group)
                .await
                .with_context(|| format!("deleting group `{group}`"))?;
            say!("deleted group {group}");
        }
        GroupCommand::DeleteOffsets { group, topic } => {
            admin
                .delete_group_offsets(&group, &topic)
                .await
                .with_context(|| format!("deleting offsets of `{topic}` from group `{group}`"))?;
            say!("deleted offsets of topic {topic} from group {group}");
        }
    }
    Ok(())
}

async fn transaction(admin: Admin, command: TransactionCommand) -> anyhow::Result<()> {
    match command {
        TransactionCommand::List { states } => {
            let states: Vec<&str> = states.iter().map(String::as_str).collect();
            let list = admin
                .list_transactions(&states)
                .await
                .context("listing transactions")?;
            for t in list {
                say!(
                    "{}\tstate={}\tproducer_id={}\tepoch={}\tpartitions={}",
                    t.transactional_id,
                    t.state,
                    t.producer_id,
                    t.producer_epoch,
                    t.partitions.len()
                );
            }
        }
        TransactionCommand::Describe { transactional_id } => {
            let t = admin
                .describe_transaction(&transactional_id)
                .await
                .with_context(|| format!("describing transactional id `{transactional_id}`"))?;
            say_raw!("{}", render_transaction(&t));
        }
    }
    Ok(())
}

fn render_transaction(t: &client::messages::TransactionDescription) -> String {
    let mut out = format!(
        "transactional_id\t{}\nstate\t{}\nproducer_id\t{}\nproducer_epoch\t{}\ntimeout_ms\t{}\nstart_ms\t{}\n",
        t.transactional_id,
        t.state,
        t.producer_id,
        t.producer_epoch,
        t.timeout_ms,
        if t.start_ms < 0 { "-".to_owned() } else { t.start_ms.to_string() },
    );
    out.push_str("topic\tpartition\n");
    for tp in &t.partitions {
        out.push_str(&format!("{}\t{}\n", tp.topic, tp.partition));
    }
    out
}

fn or_dash(value: Option<impl std::fmt::Display>) -> String {
    value.map_or_else(|| "-".to_owned(), |v| v.to_string())
}

fn render_group(d: &GroupDescription) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "group {}\tstate={}\tepoch={}\ttarget_epoch={}\tassignor={}",
        d.group_id, d.state, d.group_epoch, d.target_epoch, d.assignor
    );
    let _ = writeln!(
        out,
        "topic\tpartition\towner\tcommitted\tlog_end\tlag\tlag_seconds"
    );
    for p in &d.partitions {
        let lag_seconds = p.lag_ms.map(|ms| format!("{:.1}", ms as f64 / 1000.0));
        let _ = writeln!(
            out,
            "{}\t{}\t{}\t{}\t{}\t{}\t{}",
            p.topic,
            p.partition,
            p.owner.as_deref().unwrap_or("-"),
            or_dash(p.committed_offset),
            or_dash(p.log_end_offset),
            or_dash(p.lag_records),
            or_dash(lag_seconds)
        );
    }
    let _ = writeln!(
        out,
        "member\tinstance\tclient\thost\tepoch\tstate\tsubscribed\tassigned"
    );
    let partitions = |set: &std::collections::BTreeSet<client::TopicPartition>| {
        let list: Vec<String> = set
            .iter()
            .map(|tp| format!("{}/{}", tp.topic, tp.partition))
            .collect();
        if list.is_empty() {
            "-".to_owned()
        } else {
            list.join(",")
        }
    };
    for m in &d.members {
        let _ = writeln!(
            out,
            "{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}",
            m.member_id,
            m.instance_id.as_deref().unwrap_or("-"),
            m.client_id,
            m.client_host,
            m.member_epoch,
            m.state,
            m.subscribed_topics.join(","),
            partitions(&m.assigned)
        );
    }
    out
}

/// `consume --group`: joins the group, prints what the coordinator assigns,
/// and on any exit commits what was printed and leaves.
async fn consume_group(cluster: Cluster, args: ConsumeArgs, group: String) -> anyhow::Result<()> {
    let offset_reset = match args.from {
        SeekTo::Earliest => OffsetReset::Earliest,
        SeekTo::Latest => OffsetReset::Latest,
        _ => bail!("with --group, --from is earliest or latest: where partitions without a committed offset start"),
    };
    let mut config = GroupConfig::new(group.clone());
    config.consumer.offset_reset = offset_reset;
    config.consumer.isolation_level = args.isolation.level();
    config.instance_id = args.instance_id.clone();
    if let Some(session_timeout_ms) = args.session_timeout_ms {
        config.session_timeout_ms = session_timeout_ms;
    }
    if let Some(interval_ms) = args.commit_interval_ms {
        config.auto_commit_interval_ms = interval_ms;
    }
    // Partitions' end offsets at start, for --until-end.
    let ends = if args.until_end {
        let partitions: Vec<i32> = cluster
            .topic(&args.topic, 3)
            .await
            .with_context(|| format!("looking up topic `{}`", args.topic))?
            .partitions
            .iter()
            .map(|p| p.partition)
            .collect();
        let lookup = Consumer::new(cluster.clone(), config.consumer.clone())?;
        Some(lookup.end_offsets(&args.topic, &partitions).await?)
    } else {
        None
    };
    let mut consumer = GroupConsumer::new(cluster, config)?;
    consumer.subscribe(std::slice::from_ref(&args.topic))?;
    let printed = print_group(&mut consumer, &args, ends.as_ref()).await;
    let closed = consumer
        .close()
        .await
        .with_context(|| format!("committing and leaving group `{group}`"));
    printed.and(closed)
}

/// Polls and prints until the count, the end or a signal. Auto-commit
/// commits what earlier polls returned, all of it printed by then; records
/// a poll returned but that were not printed (past the count or the end)
/// are sought back to, so the commit on close covers exactly what was
/// printed.
async fn print_group(
    consumer: &mut GroupConsumer,
    args: &ConsumeArgs,
    ends: Option<&BTreeMap<i32, i64>>,
) -> anyhow::Result<()> {
    let template = Template::parse(args.format.as_deref().unwrap_or("{value}"), &args.null_text);
    let mut out = BufWriter::new(tokio::io::stdout());
    let mut printed = 0u64;
    let mut stop = std::pin::pin!(shutdown_signal()?);
    loop {
        if args.count.is_some_and(|count| printed >= count)
            || ends.is_some_and(|ends| read_to_end(consumer, &args.topic, ends))
        {
            break;
        }
        let records = tokio::select! {
            records = consumer.poll(Duration::from_millis(POLL_TIMEOUT_MS)) => records?,
            () = &mut stop => break,
        };
        // Per partition: the first record not printed, and whether it is past
        // the end (that partition is done).
        let mut unprinted: BTreeMap<i32, (i64, bool)> = BTreeMap::new();
        for record in &records {
            if unprinted.contains_key(&record.partition) {
                continue; // Keep each partition's printed records a prefix.
            }
            let past_end = ends.is_some_and(|ends| {
                ends.get(&record.partition)
                    .is_none_or(|end| record.offset >= *end)
            });
            if past_end || args.count.is_some_and(|count| printed >= count) {
                unprinted.insert(record.partition, (record.offset, past_end));
                continue;
            }
            out.write_all(&template.render(record))
                .await
                .map_err(output_error)?;
            out.write_all(b"\n").await.map_err(output_error)?;
            printed += 1;
        }
        out.flush().await.map_err(output_error)?;
        for (partition, (offset, past_end)) in unprinted {
            consumer
                .seek(&args.topic, partition, SeekTo::Offset(offset))
                .await?;
            if past_end {
                consumer.pause(&args.topic, partition)?;
            }
        }
    }
    out.flush().await.map_err(output_error)?;
    Ok(())
}

/// --until-end with --group: the member owns a partition, and every one it
/// owns is read up to its end offset at start.
fn read_to_end(consumer: &GroupConsumer, topic: &str, ends: &BTreeMap<i32, i64>) -> bool {
    let owned = consumer.assignment();
    !owned.is_empty()
        && owned.iter().all(|tp| {
            ends.get(&tp.partition).is_none_or(|end| {
                consumer
                    .position(topic, tp.partition)
                    .is_some_and(|position| position >= *end)
            })
        })
}

/// Resolves on the first SIGINT or SIGTERM.
fn shutdown_signal() -> anyhow::Result<impl std::future::Future<Output = ()>> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut interrupt = signal(SignalKind::interrupt()).context("handling SIGINT")?;
    let mut terminate = signal(SignalKind::terminate()).context("handling SIGTERM")?;
    Ok(async move {
        tokio::select! {
            _ = interrupt.recv() => {}
            _ = terminate.recv() => {}
        }
    })
}

/// A parsed `--format` template.
#[derive(Debug)]
struct Template {
    parts: Vec<Part>,
    null_text: Vec<u8>,
}

#[derive(Debug)]
enum Part {
    Text(Vec<u8>),
    Partition,
    Offset,
    Timestamp,
    Key,
    Value,
}

impl Template {
    fn parse(template: &str, null_text: &str) -> Template {
        let template = template.replace("\\n", "\n").replace("\\t", "\t");
        let mut parts = Vec::new();
        let mut rest = template.as_str();
        while !rest.is_empty() {
            let next = [
                ("{partition}", 0u8),
                ("{offset}", 1),
                ("{timestamp}", 2),
                ("{key}", 3),
                ("{value}", 4),
            ]
            .iter()
            .filter_map(|(name, id)| rest.find(name).map(|at| (at, *name, *id)))
            .min_by_key(|(at, _, _)| *at);
            match next {
                None => {
                    parts.push(Part::Text(rest.as_bytes().to_vec()));
                    break;
                }
                Some((at, name, id)) => {
                    if at > 0 {
                        parts.push(Part::Text(rest.as_bytes()[..at].to_vec()));
                    }
                    parts.push(match id {
                        0 => Part::Partition,
                        1 => Part::Offset,
                        2 => Part::Timestamp,
                        3 => Part::Key,
                        _ => Part::Value,
                    });
                    rest = &rest[at + name.len()..];
                }
            }
        }
        Template {
            parts,
            null_text: null_text.as_bytes().to_vec(),
        }
    }

    fn render(&self, record: &ConsumerRecord) -> Vec<u8> {
        let mut out = Vec::new();
        for part in &self.parts {
            match part {
                Part::Text(text) => out.extend_from_slice(text),
                Part::Partition => out.extend_from_slice(record.partition.to_string().as_bytes()),
                Part::Offset => out.extend_from_slice(record.offset.to_string().as_bytes()),
                Part::Timestamp => {
                    out.extend_from_slice(record.timestamp_ms.to_string().as_bytes())
                }
                Part::Key => {
                    out.extend_from_slice(record.key.as_deref().unwrap_or(&self.null_text))
                }
                Part::Value => {
                    out.extend_from_slice(record.value.as_deref().unwrap_or(&self.null_text))
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn format_template_and_flags_parse() {
        // Proves the --format placeholders, --from forms and key splitting
        // behave as the help text says.
        let record = ConsumerRecord {
            topic: "t".into(),
            partition: 2,
            offset: 7,
            timestamp_ms: 99,
            key: Some(Bytes::from_static(b"k")),
            value: Some(Bytes::from_static(b"v")),
            headers: Vec::new(),
        };
        let template = Template::parse(
            "{partition}:{offset}@{timestamp}\\t{key}={value}!",
            "<null>",
        );
        assert_eq!(template.render(&record), b"2:7@99\tk=v!");
        let tombstone = ConsumerRecord {
            value: None,
            ..record.clone()
        };
        let empty = ConsumerRecord {
            value: Some(Bytes::new()),
            ..record.clone()
        };
        let values = Template::parse("{key}={value}", "<null>");
        assert_eq!(values.render(&tombstone), b"k=<null>");
        assert_eq!(values.render(&empty), b"k=");
        assert_eq!(parse_from("@5"), Ok(SeekTo::Timestamp(5)));
        assert_eq!(parse_from("12"), Ok(SeekTo::Offset(12)));
        assert_eq!(parse_from("latest"), Ok(SeekTo::Latest));
        assert!(parse_from("-3").is_err());
        let (key, value) = split_key(b"a::b::c", Some("::"));
        assert_eq!(
            (key.as_deref(), &value[..]),
            (Some(&b"a"[..]), &b"b::c"[..])
        );
        let (key, value) = split_key(b"abc", Some(":"));
        assert_eq!((key, &value[..]), (None, &b"abc"[..]));
        assert_eq!(
            parse_key_value("flush.policy=interval_ms:5"),
            Ok(("flush.policy".into(), "interval_ms:5".into()))
        );
    }

    #[test]
    fn group_flags_parse() {
        // Proves the group commands accept their documented forms: a reset
        // to a negative duration is not taken for a flag, and --group
        // excludes --partition.
        let cli = Cli::try_parse_from([
            "ringlog",
            "group",
            "reset",
            "g",
            "--topic",
            "t",
            "--to",
            "-10m",
            "--dry-run",
        ])
        .unwrap();
        match cli.command {
            Command::Group(GroupCommand::Reset { to, dry_run, .. }) => {
                assert_eq!(to, ResetTo::Back(Duration::from_secs(600)));
                assert!(dry_run);
            }
            other => panic!("parsed as {other:?}"),
        }
        assert!(
            Cli::try_parse_from(["ringlog", "group", "delete-offsets", "g", "--topic", "t"])
                .is_ok()
        );
        assert!(Cli::try_parse_from([
            "ringlog",
            "consume",
            "t",
            "--group",
            "g",
            "--partition",
            "0"
        ])
        .is_err());
        assert!(Cli::try_parse_from(["ringlog", "consume", "t", "--instance-id", "i"]).is_err());
        assert!(Cli::try_parse_from([
            "ringlog", "group", "reset", "g", "--topic", "t", "--to", "-1y"
        ])
        .is_err());
    }
}
