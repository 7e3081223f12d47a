// The meshtrain subcommands. Each parses its own flags (argv[2..]) and returns an exit code;
// errors are thrown as mt::Error and reported once by main().
#pragma once

namespace mt::cli {

int run_train(int argc, char** argv);
int run_eval(int argc, char** argv);
int run_grad(int argc, char** argv);
int run_init(int argc, char** argv);
int run_smoke(int argc, char** argv);
int run_plan(int argc, char** argv);
int run_parity(int argc, char** argv);
int run_compare(int argc, char** argv);
int run_checkpoint(int argc, char** argv);  // checkpoint inspect DIR
int run_export(int argc, char** argv);
int run_generate(int argc, char** argv);
int run_tokenize(int argc, char** argv);  // text files -> an llm.c token shard

}  // namespace mt::cli
