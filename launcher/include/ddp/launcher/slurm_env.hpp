#pragma once
// Defaults for a job launched by Slurm: `srun ddprun ...` on every node of an allocation
// needs no --nnodes, --node_rank, --master_addr or --rdzv_id, because Slurm already says
// them in SLURM_* variables. Pure: the environment comes in as a lookup function.

#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace ddp::launcher {

// A SLURM_* variable that cannot be used: what() names the variable, its value and what is
// wrong with it, in one line.
class SlurmEnvError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

// The most hosts expand_nodelist produces, so that "n[0-999999999]" fails instead of
// exhausting memory.
inline constexpr std::size_t kMaxNodelistHosts = 1'000'000;

// Expands Slurm's compressed host list into host names, in the order written:
// "gpu[01-04,07],cpu-a[1-2]" -> gpu01 gpu02 gpu03 gpu04 gpu07 cpu-a1 cpu-a2. A range keeps
// the width of its lower bound ("[08-10]" -> 08 09 10); several brackets in one name expand
// as a product, the first bracket outermost ("r[1-2]n[1-2]" -> r1n1 r1n2 r2n1 r2n2).
// Throws SlurmEnvError (naming the list and the position) on an empty list or name, an
// unclosed or nested bracket, a bound that is not a number, a range whose end is below its
// start, whitespace, or more than kMaxNodelistHosts hosts.
std::vector<std::string> expand_nodelist(std::string_view nodelist);

// One option value Slurm provides, as option text, with the variable it came from.
struct SlurmOption {
  std::string dest;    // the option's dest in the CLI's table: "nnodes", "node_rank", ...
  std::string value;   // "2", "1", "node1", "42"
  std::string source;  // "SLURM_NNODES", for messages: "SLURM_NNODES=2"
  bool operator==(const SlurmOption&) const = default;
};

// What Slurm says about this job. Each value is optional: a variable Slurm did not set
// gives no default (the CLI's own default then applies). Inside an srun step the step's
// variables come first: `srun -N1` in a two-node allocation is a one-node job.
struct SlurmDefaults {
  std::string job_id;                    // SLURM_JOB_ID
  bool in_step = false;                  // SLURM_STEP_ID set: started by srun
  std::optional<SlurmOption> nnodes;     // SLURM_STEP_NUM_NODES, SLURM_NNODES, SLURM_JOB_NUM_NODES
  std::optional<SlurmOption> node_rank;  // SLURM_NODEID
  std::optional<SlurmOption> master_addr;  // first host of SLURM_STEP_NODELIST,
                                           // SLURM_JOB_NODELIST or SLURM_NODELIST
  std::optional<SlurmOption> rdzv_id;      // SLURM_JOB_ID

  // The values present, in the order above.
  std::vector<SlurmOption> options() const;
  // A copy without the values whose dest `given(dest)` says the user set explicitly (on the
  // command line or in a PET_ variable): those win over Slurm.
  SlurmDefaults without(const std::function<bool(std::string_view dest)>& given) const;
  // One line saying what was taken, e.g. "ddprun: from Slurm job 42: --nnodes=2
  // --node_rank=1 --master_addr=node1 --rdzv_id=42"; empty when nothing is left to take.
  std::string summary() const;
  // Throws SlurmEnvError when this takes --nnodes above 1 outside an srun step (in the batch
  // script itself, or an salloc shell): there ddprun runs on one node only, and would wait
  // for the others until the rendezvous timeout. Call it on what is left after without().
  void check_started_by_srun() const;
};

// nullopt when SLURM_JOB_ID is unset or empty (not inside a Slurm job). Otherwise what the
// SLURM_* variables give. Throws SlurmEnvError when one of them is set but malformed (a
// count that is not a positive number, a node id that is not below the node count, a node
// list expand_nodelist refuses), so a broken allocation fails before any rendezvous.
std::optional<SlurmDefaults> slurm_defaults(
    const std::function<std::optional<std::string>(const std::string&)>& getenv);

}  // namespace ddp::launcher
