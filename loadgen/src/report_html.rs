//! `report.html`: one self-contained page with inline SVG drawn here, from
//! a `TestResult`. It must never reference an outside resource: no
//! scripts, no stylesheets or fonts by URL, no images, not even the SVG
//! namespace URL (inline SVG in HTML5 does not need it).

use std::fmt::Write as _;

use crate::report::{QuantileCurve, TestResult};

const WIDTH_PX: f64 = 760.0;
const HEIGHT_PX: f64 = 340.0;
const MARGIN_LEFT_PX: f64 = 70.0;
const MARGIN_RIGHT_PX: f64 = 150.0;
const MARGIN_TOP_PX: f64 = 30.0;
const MARGIN_BOTTOM_PX: f64 = 45.0;
/// The percentile axis stops at 99.9999 % (1/(1-p) = 10^6).
const INVERSE_QUANTILE_MAX: f64 = 1e6;
const COLORS: [&str; 4] = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd"];

/// One line of a chart.
#[derive(Debug)]
struct Line<'a> {
    label: &'a str,
    points: Vec<(f64, f64)>,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum XAxis {
    Linear,
    /// x is 1/(1-p), drawn on log10, labelled as percentiles.
    InversePercentileLog,
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// 1, 2 or 5 times a power of ten, about a fifth of `span`.
fn nice_step(span: f64) -> f64 {
    if span <= 0.0 || !span.is_finite() {
        return 1.0;
    }
    let raw = span / 5.0;
    let magnitude = 10f64.powf(raw.log10().floor());
    let fraction = raw / magnitude;
    let nice = if fraction <= 1.0 {
        1.0
    } else if fraction <= 2.0 {
        2.0
    } else if fraction <= 5.0 {
        5.0
    } else {
        10.0
    };
    nice * magnitude
}

fn percentile_label(inverse: f64) -> String {
    let percentile = 100.0 * (1.0 - 1.0 / inverse);
    let text = format!("{percentile:.4}");
    let text = text.trim_end_matches('0').trim_end_matches('.');
    format!("{text}%")
}

fn svg_chart(
    title: &str,
    x_label: &str,
    y_label: &str,
    lines: &[Line<'_>],
    x_axis: XAxis,
) -> String {
    let plot_w = WIDTH_PX - MARGIN_LEFT_PX - MARGIN_RIGHT_PX;
    let plot_h = HEIGHT_PX - MARGIN_TOP_PX - MARGIN_BOTTOM_PX;
    let all = || lines.iter().flat_map(|line| line.points.iter().copied());
    let x_of = |x: f64| match x_axis {
        XAxis::Linear => x,
        XAxis::InversePercentileLog => x.max(1.0).log10(),
    };
    let (x_min, x_max) = match x_axis {
        XAxis::Linear => (
            all().map(|p| p.0).fold(f64::INFINITY, f64::min).min(0.0),
            all().map(|p| p.0).fold(1.0, f64::max),
        ),
        XAxis::InversePercentileLog => {
            let decades = all().map(|p| x_of(p.0)).fold(2.0, f64::max).ceil();
            (0.0, decades.min(INVERSE_QUANTILE_MAX.log10()))
        }
    };
    let y_top = all().map(|p| p.1).fold(0.0, f64::max);
    let y_step = nice_step(y_top);
    let y_max = ((y_top / y_step).ceil() * y_step).max(y_step);
    let px =
        |x: f64| MARGIN_LEFT_PX + (x_of(x) - x_min) / (x_max - x_min).max(f64::EPSILON) * plot_w;
    let py = |y: f64| MARGIN_TOP_PX + plot_h - y / y_max * plot_h;

    let mut svg = format!(
        "<svg width=\"{WIDTH_PX}\" height=\"{HEIGHT_PX}\" viewBox=\"0 0 {WIDTH_PX} {HEIGHT_PX}\" role=\"img\" aria-label=\"{t}\">\n<text x=\"{MARGIN_LEFT_PX}\" y=\"18\" class=\"title\">{t}</text>\n",
        t = escape(title)
    );
    // Horizontal grid and y labels.
    let mut y = 0.0;
    while y <= y_max + y_step / 2.0 {
        let _ = writeln!(
            svg,
            "<line x1=\"{:.1}\" y1=\"{yy:.1}\" x2=\"{:.1}\" y2=\"{yy:.1}\" class=\"grid\"/><text x=\"{:.1}\" y=\"{:.1}\" class=\"ylabel\">{}</text>",
            MARGIN_LEFT_PX,
            MARGIN_LEFT_PX + plot_w,
            MARGIN_LEFT_PX - 6.0,
            py(y) + 4.0,
            trim_number(y),
            yy = py(y)
        );
        y += y_step;
    }
    // Vertical ticks and x labels.
    let x_ticks: Vec<(f64, String)> = match x_axis {
        XAxis::Linear => {
            let step = nice_step(x_max - x_min);
            let count = ((x_max - x_min) / step).floor() as usize;
            (0..=count)
                .map(|k| {
                    (
                        x_min + k as f64 * step,
                        trim_number(x_min + k as f64 * step),
                    )
                })
                .collect()
        }
        XAxis::InversePercentileLog => (0..=x_max as i32)
            .map(|decade| {
                let inverse = 10f64.powi(decade);
                (inverse, percentile_label(inverse))
            })
            .collect(),
    };
    for (x, label) in x_ticks {
        let _ = writeln!(
            svg,
            "<line x1=\"{xx:.1}\" y1=\"{:.1}\" x2=\"{xx:.1}\" y2=\"{:.1}\" class=\"grid\"/><text x=\"{xx:.1}\" y=\"{:.1}\" class=\"xlabel\">{}</text>",
            MARGIN_TOP_PX,
            MARGIN_TOP_PX + plot_h,
            MARGIN_TOP_PX + plot_h + 16.0,
            escape(&label),
            xx = px(x)
        );
    }
    let _ = writeln!(
        svg,
        "<text x=\"{:.1}\" y=\"{:.1}\" class=\"axis\">{}</text><text x=\"14\" y=\"{:.1}\" class=\"axis\" transform=\"rotate(-90 14 {:.1})\">{}</text>",
        MARGIN_LEFT_PX + plot_w / 2.0,
        HEIGHT_PX - 6.0,
        escape(x_label),
        MARGIN_TOP_PX + plot_h / 2.0,
        MARGIN_TOP_PX + plot_h / 2.0,
        escape(y_label)
    );
    for (index, line) in lines.iter().enumerate() {
        let color = COLORS[index % COLORS.len()];
        let points: Vec<String> = line
            .points
            .iter()
            .filter(|(x, _)| x.is_finite() && x_of(*x) <= x_max)
            .map(|&(x, y)| format!("{:.1},{:.1}", px(x), py(y)))
            .collect();
        // Alternate lines are dashed so a line hidden under its neighbour
        // (consume rate equal to publish rate) still shows.
        let dash = if index % 2 == 1 {
            " stroke-dasharray=\"6 3\""
        } else {
            ""
        };
        let _ = writeln!(
            svg,
            "<polyline fill=\"none\" stroke=\"{color}\" stroke-width=\"1.6\"{dash} points=\"{}\"/>",
            points.join(" ")
        );
        let legend_y = MARGIN_TOP_PX + 14.0 + index as f64 * 18.0;
        let legend_x = MARGIN_LEFT_PX + plot_w + 12.0;
        let _ = writeln!(
            svg,
            "<rect x=\"{legend_x:.1}\" y=\"{:.1}\" width=\"12\" height=\"4\" fill=\"{color}\"/><text x=\"{:.1}\" y=\"{legend_y:.1}\" class=\"legend\">{}</text>",
            legend_y - 5.0,
            legend_x + 16.0,
            escape(line.label)
        );
    }
    svg.push_str("</svg>\n");
    svg
}

fn trim_number(value: f64) -> String {
    if value >= 1e6 {
        return format!("{}M", trim_number(value / 1e6));
    }
    if value >= 1e3 && value.fract() == 0.0 && (value / 1e3).fract() == 0.0 {
        return format!("{}k", value / 1e3);
    }
    let text = format!("{value:.3}");
    text.trim_end_matches('0').trim_end_matches('.').to_string()
}

/// Percentile curve points as (1/(1-p), value); the 100 % point is dropped
/// (it lies at infinity).
fn inverse_points(curve: &QuantileCurve) -> Vec<(f64, f64)> {
    curve
        .0
        .iter()
        .filter(|(percentile, _)| *percentile < 100.0)
        .map(|&(percentile, value_ms)| (1.0 / (1.0 - percentile / 100.0), value_ms))
        .collect()
}

fn series(x: &[f64], y: &[f64]) -> Vec<(f64, f64)> {
    x.iter().copied().zip(y.iter().copied()).collect()
}

fn summary_table(r: &TestResult) -> String {
    let mut out = String::from("<table><tr><th>latency (ms)</th><th>avg</th><th>p50</th><th>p75</th><th>p95</th><th>p99</th><th>p99.9</th><th>p99.99</th><th>max</th></tr>\n");
    let rows = [
        (
            "publish",
            [
                r.aggregated_publish_latency_avg,
                r.aggregated_publish_latency_50pct,
                r.aggregated_publish_latency_75pct,
                r.aggregated_publish_latency_95pct,
                r.aggregated_publish_latency_99pct,
                r.aggregated_publish_latency_999pct,
                r.aggregated_publish_latency_9999pct,
                r.aggregated_publish_latency_max,
            ],
        ),
        (
            "publish delay",
            [
                r.aggregated_publish_delay_latency_avg,
                r.aggregated_publish_delay_latency_50pct,
                r.aggregated_publish_delay_latency_75pct,
                r.aggregated_publish_delay_latency_95pct,
                r.aggregated_publish_delay_latency_99pct,
                r.aggregated_publish_delay_latency_999pct,
                r.aggregated_publish_delay_latency_9999pct,
                r.aggregated_publish_delay_latency_max,
            ],
        ),
        (
            "end to end",
            [
                r.aggregated_end_to_end_latency_avg,
                r.aggregated_end_to_end_latency_50pct,
                r.aggregated_end_to_end_latency_75pct,
                r.aggregated_end_to_end_latency_95pct,
                r.aggregated_end_to_end_latency_99pct,
                r.aggregated_end_to_end_latency_999pct,
                r.aggregated_end_to_end_latency_9999pct,
                r.aggregated_end_to_end_latency_max,
            ],
        ),
    ];
    for (name, values) in rows {
        let cells: String = values.iter().map(|v| format!("<td>{v:.3}</td>")).collect();
        let _ = writeln!(out, "<tr><th>{name}</th>{cells}</tr>");
    }
    out.push_str("</table>\n");
    out
}

/// The whole page.
pub fn render_html(r: &TestResult) -> String {
    let w = &r.workload;
    let title = format!("Ringlog load run: {}", w.workload);
    let mut page = format!(
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>{t}</title>\n<style>body{{font-family:sans-serif;margin:24px;color:#222}} table{{border-collapse:collapse;margin:12px 0}} td,th{{border:1px solid #ccc;padding:3px 8px;text-align:right}} .grid{{stroke:#e4e4e4}} .title{{font-weight:bold;font-size:14px}} .ylabel{{font-size:11px;text-anchor:end}} .xlabel{{font-size:11px;text-anchor:middle}} .axis{{font-size:12px;text-anchor:middle}} .legend{{font-size:12px}}</style></head><body>\n<h1>{t}</h1>\n",
        t = escape(&title)
    );
    let consumers = match &w.consumer_group {
        Some(group) => format!(
            "{} consumers in each of {} consumer groups ({})",
            w.consumers_per_topic,
            w.subscriptions_per_topic,
            escape(group)
        ),
        None => format!("{} consumers", w.consumers_per_topic),
    };
    let _ = writeln!(
        page,
        "<p>topic {} · {} partitions · RF {} · {} B messages · target {} msg/s · {} producers · {} · acks={} · batch {} B · linger {} ms · compression {} · keys {} · payload {} · {} s measured after {} s warmup · seed {}</p>",
        escape(&w.topic), w.partitions, w.replication_factor, w.message_size, w.target_rate_msgs_per_s,
        w.producers_per_topic, consumers, escape(&w.acks), w.batch_bytes, w.linger_ms,
        escape(&w.compression), escape(&w.keys), escape(&w.payload), w.duration_s, w.warmup_s, w.seed
    );
    let _ = writeln!(
        page,
        "<p>published {} · acked {} · consumed {} · errors {} · all latencies in ms</p>",
        r.published_messages, r.acked_messages, r.consumed_messages, r.errors
    );
    if let Some(cpu) = r.cpu {
        let _ = writeln!(
            page,
            "<p>CPU over the measured seconds, of {} cores: load generator {:.2} cores · everything else {:.2} (the broker, on a host running nothing else) · taken by the hypervisor {:.2}</p>",
            cpu.machine_cores, cpu.loadgen_cores, cpu.other_cores, cpu.stolen_cores
        );
    }
    page.push_str(&summary_table(r));
    page.push_str(&svg_chart(
        "Latency by percentile",
        "percentile (log scale of 1/(1-p))",
        "latency (ms)",
        &[
            Line {
                label: "publish",
                points: inverse_points(&r.aggregated_publish_latency_quantiles),
            },
            Line {
                label: "publish delay",
                points: inverse_points(&r.aggregated_publish_delay_latency_quantiles),
            },
            Line {
                label: "end to end",
                points: inverse_points(&r.aggregated_end_to_end_latency_quantiles),
            },
        ],
        XAxis::InversePercentileLog,
    ));
    page.push_str(&svg_chart(
        "Throughput",
        "elapsed (s)",
        "messages per second",
        &[
            Line {
                label: "publish msg/s",
                points: series(&r.elapsed_seconds, &r.publish_rate),
            },
            Line {
                label: "consume msg/s",
                points: series(&r.elapsed_seconds, &r.consume_rate),
            },
        ],
        XAxis::Linear,
    ));
    page.push_str(&svg_chart(
        "Latency over time",
        "elapsed (s)",
        "latency (ms)",
        &[
            Line {
                label: "publish p50",
                points: series(&r.elapsed_seconds, &r.publish_latency_50pct),
            },
            Line {
                label: "publish p99",
                points: series(&r.elapsed_seconds, &r.publish_latency_99pct),
            },
            Line {
                label: "end-to-end p50",
                points: series(&r.elapsed_seconds, &r.end_to_end_latency_50pct),
            },
            Line {
                label: "end-to-end p99",
                points: series(&r.elapsed_seconds, &r.end_to_end_latency_99pct),
            },
        ],
        XAxis::Linear,
    ));
    page.push_str("</body></html>\n");
    page
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::tests::{sample_recorder, sample_workload};

    fn page() -> String {
        render_html(&TestResult::build(&sample_workload(), &sample_recorder()))
    }

    // The page is self-contained: no URLs, no scripts, no external links or images.
    #[test]
    fn no_external_references() {
        let html = page();
        for forbidden in [
            "http://", "https://", "<script", "<link", "<img", "src=", "@import", "url(",
        ] {
            assert!(!html.contains(forbidden), "found {forbidden:?}");
        }
    }

    // It has the three SVG plots with their lines and legends.
    #[test]
    fn has_svg_plots() {
        let html = page();
        assert_eq!(html.matches("<svg ").count(), 3);
        assert_eq!(html.matches("</svg>").count(), 3);
        assert_eq!(html.matches("<polyline").count(), 3 + 2 + 4);
        for needle in [
            "Latency by percentile",
            "Throughput",
            "Latency over time",
            "99.9%",
            "publish p99",
        ] {
            assert!(html.contains(needle), "{needle}");
        }
        // Every polyline has points (the sample run has data for all of them).
        assert!(!html.contains("points=\"\""));
    }

    // Text from the workload is escaped.
    #[test]
    fn escapes_workload_text() {
        let mut workload = sample_workload();
        workload.topic = "<b>x</b>".to_string();
        let html = render_html(&TestResult::build(&workload, &sample_recorder()));
        assert!(html.contains("&lt;b&gt;x&lt;/b&gt;"));
        assert!(!html.contains("<b>x"));
    }

    // Axis helpers: nice steps and percentile labels.
    #[test]
    fn axis_helpers() {
        assert_eq!(nice_step(10.0), 2.0);
        assert_eq!(nice_step(1_000_000.0), 200_000.0);
        assert_eq!(percentile_label(1_000.0), "99.9%");
        assert_eq!(percentile_label(1.0), "0%");
        assert_eq!(trim_number(2_000_000.0), "2M");
        assert_eq!(trim_number(0.25), "0.25");
    }
}
