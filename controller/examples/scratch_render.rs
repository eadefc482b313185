use clap::Parser;
#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    args: isthmus_controller::RenderArgs,
}
fn main() {
    let cli = Cli::parse();
    match isthmus_controller::offline::render_with_warnings(&cli.args) {
        Ok((t, w)) => {
            for x in w {
                eprintln!("warning: {x}");
            }
            print!("{t}");
        }
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(1);
        }
    }
}
