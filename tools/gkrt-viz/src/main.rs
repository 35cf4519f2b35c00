//! `gkrt-viz TRACE.json OUT.svg [WIDTH HEIGHT]`: draws a gkrt trace as an SVG, then prints a
//! line per run: how much of its measured call the compute slices cover, the stacked memory's
//! peak against the allocated bytes' (`gkrt_viz::report`).

use std::process::ExitCode;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    if args.len() != 3 && args.len() != 5 {
        eprintln!("usage: gkrt-viz TRACE.json OUT.svg [WIDTH HEIGHT]  (default 1600 x 900)");
        return ExitCode::from(2);
    }
    let size = |i: usize, default: u32| -> Option<u32> {
        args.get(i).map_or(Some(default), |s| {
            s.parse().ok().filter(|&v| (100..=20000).contains(&v))
        })
    };
    let (Some(width), Some(height)) = (size(3, 1600), size(4, 900)) else {
        eprintln!("gkrt-viz: WIDTH and HEIGHT are pixels, 100 to 20000");
        return ExitCode::from(2);
    };
    let json = match std::fs::read_to_string(&args[1]) {
        Ok(j) => j,
        Err(e) => {
            eprintln!("gkrt-viz: reading {}: {e}", args[1]);
            return ExitCode::FAILURE;
        }
    };
    let title = std::path::Path::new(&args[1])
        .file_name()
        .map_or("gkrt trace".into(), |n| {
            format!("gkrt trace: {}", n.to_string_lossy())
        });
    match gkrt_viz::render(&json, &title, width, height) {
        Ok(svg) => match std::fs::write(&args[2], svg) {
            Ok(()) => {
                // The accounting of each run, for the reader of a benchmark's log.
                if let Ok(report) = gkrt_viz::report(&json) {
                    print!("{report}");
                }
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("gkrt-viz: writing {}: {e}", args[2]);
                ExitCode::FAILURE
            }
        },
        Err(e) => {
            eprintln!("gkrt-viz: {}: {e}", args[1]);
            ExitCode::FAILURE
        }
    }
}
