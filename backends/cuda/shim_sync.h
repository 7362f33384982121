// Shared memory and barriers for emulated CUDA kernels (cooperative.py).
//
// cooperative.py pastes this text after shim.h into the C++ it compiles (it is not #included),
// so it is part of the emulation cache key and editing it rebuilds every library.
//
// Every CUDA thread of a launch runs as a fiber (ucontext) on its own stack. A scheduler
// resumes the runnable fibers round-robin, block by block; a fiber runs until it reaches a
// barrier or returns. After a round no fiber is runnable: each waits at a barrier or has
// returned. A block barrier opens when every thread of its block waits at it, the grid barrier
// when every thread of the grid does; a block whose threads disagree (some wait at
// __syncthreads() while others returned or wait at the grid barrier), or a grid barrier that a
// returned thread can never reach, stops the launch with a message instead of hanging. Every
// round either opens a barrier, finishes, or stops, so no launch deadlocks (a kernel that loops
// forever still does).
//
// A normal launch runs blocks one after another, each with fresh fibers; a cooperative launch
// runs all blocks' fibers interleaved, which this_grid().sync() needs.
//
// Shared memory. Static `__shared__ T x[N];` becomes a static variable in the section
// "rnnc_shared". A normal launch runs one block at a time, so one copy serves every block; a
// cooperative launch keeps one copy of the whole section per block and swaps it in before
// resuming a block's fibers, so static shared memory is per block there too. Dynamic shared
// memory (`extern __shared__` has no C++ equivalent, so it does not compile here) is reached
// through rnnc_shared<T>(), which returns the current block's buffer of `shared_mem` bytes (the
// CUDA prelude in cooperative.py defines the same function for nvcc). Shared memory is filled
// with 0xFF bytes (NaN as float or double, -1 as an int) when a block starts, since its contents
// are undefined on a GPU: a kernel reading it before writing it gets NaN rather than zeros.
//
// One launch at a time per library (a mutex): the static shared variables exist once.
#ifndef RNNC_SHIM_SYNC_H
#define RNNC_SHIM_SYNC_H

#include <sys/mman.h>
#include <ucontext.h>

#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <new>
#include <vector>

#define __shared__ static __attribute__((section("rnnc_shared")))

// The linker defines these bounds of the section; hidden so that another loaded library's
// section can never be taken for this one's. The anchor keeps the section (and the bounds) in
// a library whose kernels declare no shared memory.
extern "C" unsigned char __start_rnnc_shared[] __attribute__((visibility("hidden")));
extern "C" unsigned char __stop_rnnc_shared[] __attribute__((visibility("hidden")));
static __attribute__((section("rnnc_shared"), used)) unsigned char rnnc_shared_anchor[1];

namespace rnnc_sync {

enum class State { runnable, at_block_barrier, at_grid_barrier, returned };

constexpr size_t STACK_BYTES = 64 * 1024;
// The lowest bytes of every stack hold a pattern: a thread that overwrote them overflowed.
constexpr size_t CANARY_BYTES = 64;
constexpr unsigned char CANARY = 0xA5;
constexpr unsigned char POISON = 0xFF;
// Per-block dynamic buffers start at multiples of this, so any type is aligned.
constexpr size_t SHARED_ALIGN = 16;

struct Fiber {
    ucontext_t context;  // points into itself: a Fiber never moves once started
    unsigned char* stack;
    unsigned block, thread;
    State state;
};

struct Launch {
    void (*body)(void**);
    void** args;
    unsigned block_threads;
    bool cooperative;
    size_t shared_stride;            // bytes between two blocks' dynamic buffers
    unsigned char* dynamic;          // the running block's dynamic shared memory
    unsigned char* static_copies;    // cooperative launches: one section copy per block
    Fiber* current;
    ucontext_t scheduler;
    char* error;
    size_t error_size;
};

static thread_local Launch* active = nullptr;
static std::mutex launch_mutex;

static size_t static_bytes() { return size_t(__stop_rnnc_shared - __start_rnnc_shared); }

__attribute__((format(printf, 2, 3))) static bool fail(Launch& launch, const char* format, ...) {
    va_list values;
    va_start(values, format);
    vsnprintf(launch.error, launch.error_size, format, values);
    va_end(values);
    return false;
}

static void fiber_entry() {
    Launch* launch = active;
    launch->body(launch->args);
    launch->current->state = State::returned;
    // Returning resumes uc_link, the scheduler.
}

// Called by a kernel's thread: wait at a barrier until the scheduler resumes this fiber.
static void wait(State barrier) {
    Launch* launch = active;
    Fiber* self = launch->current;
    self->state = barrier;
    swapcontext(&self->context, &launch->scheduler);
}

// Stacks for count fibers in one mapping: pages never touched are never committed.
struct Stacks {
    unsigned char* base = nullptr;
    size_t bytes = 0;
    explicit Stacks(size_t count) : bytes(count * STACK_BYTES) {
        void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (p == MAP_FAILED) throw std::bad_alloc();
        base = static_cast<unsigned char*>(p);
    }
    ~Stacks() { munmap(base, bytes); }
    Stacks(const Stacks&) = delete;
    Stacks& operator=(const Stacks&) = delete;
    unsigned char* operator[](size_t i) const { return base + i * STACK_BYTES; }
};

static void start(Launch& launch, Fiber& fiber, unsigned char* stack, unsigned block,
                  unsigned thread) {
    getcontext(&fiber.context);
    fiber.context.uc_stack.ss_sp = stack;
    fiber.context.uc_stack.ss_size = STACK_BYTES;
    fiber.context.uc_link = &launch.scheduler;
    makecontext(&fiber.context, fiber_entry, 0);
    memset(stack, CANARY, CANARY_BYTES);
    fiber.stack = stack;
    fiber.block = block;
    fiber.thread = thread;
    fiber.state = State::runnable;
}

// Runs one fiber until it waits at a barrier or returns, with its own indices.
static bool resume(Launch& launch, Fiber& fiber) {
    threadIdx = {fiber.thread, 0, 0};
    blockIdx = {fiber.block, 0, 0};
    launch.current = &fiber;
    __asm__ __volatile__("" ::: "memory");
    swapcontext(&launch.scheduler, &fiber.context);
    __asm__ __volatile__("" ::: "memory");
    for (size_t i = 0; i < CANARY_BYTES; ++i) {
        if (fiber.stack[i] != CANARY) {
            return fail(launch, "block %u thread %u overflowed its %zu KiB stack (large local "
                        "arrays belong in shared or global memory)",
                        fiber.block, fiber.thread, STACK_BYTES / 1024);
        }
    }
    if (fiber.state == State::at_grid_barrier && !launch.cooperative) {
        return fail(launch, "block %u thread %u called this_grid().sync() in a launch that is "
                    "not cooperative (create the module with enable_cooperative_groups=True)",
                    fiber.block, fiber.thread);
    }
    return true;
}

// Resumes every runnable fiber of blocks [0, blocks) of fibers, a block at a time.
static bool run_round(Launch& launch, Fiber* fibers, unsigned blocks, unsigned char* dynamic) {
    const unsigned n = launch.block_threads;
    const size_t section = static_bytes();
    for (unsigned k = 0; k < blocks; ++k) {
        Fiber* block = fibers + size_t(k) * n;
        bool runnable = false;
        for (unsigned t = 0; t < n && !runnable; ++t) runnable = block[t].state == State::runnable;
        if (!runnable) continue;
        launch.dynamic = dynamic + k * launch.shared_stride;
        unsigned char* copy = launch.static_copies ? launch.static_copies + k * section : nullptr;
        if (copy) memcpy(__start_rnnc_shared, copy, section);
        for (unsigned t = 0; t < n; ++t) {
            if (block[t].state == State::runnable && !resume(launch, block[t])) return false;
        }
        if (copy) memcpy(copy, __start_rnnc_shared, section);
    }
    return true;
}

// How many threads of a set are in each state, and the first of each.
struct Census {
    unsigned count[4] = {0, 0, 0, 0};
    const Fiber* first[4] = {nullptr, nullptr, nullptr, nullptr};
    void add(const Fiber& fiber) {
        int s = int(fiber.state);
        if (count[s]++ == 0) first[s] = &fiber;
    }
    unsigned at(State s) const { return count[int(s)]; }
    const Fiber& first_at(State s) const { return *first[int(s)]; }
};

static bool divergent_block(Launch& launch, unsigned block, const Census& c) {
    char grid[96] = "", returned[96] = "";
    if (c.at(State::at_grid_barrier)) {
        snprintf(grid, sizeof grid, ", %u wait at this_grid().sync() (first: thread %u)",
                 c.at(State::at_grid_barrier), c.first_at(State::at_grid_barrier).thread);
    }
    if (c.at(State::returned)) {
        snprintf(returned, sizeof returned, ", %u returned (first: thread %u)",
                 c.at(State::returned), c.first_at(State::returned).thread);
    }
    return fail(launch, "divergent barrier in block %u: %u threads wait at __syncthreads() "
                "(first: thread %u)%s%s; every thread of a block must reach the same barrier",
                block, c.at(State::at_block_barrier), c.first_at(State::at_block_barrier).thread,
                grid, returned);
}

static void open_barrier(Fiber* fibers, size_t count, State barrier) {
    for (size_t i = 0; i < count; ++i) {
        if (fibers[i].state == barrier) fibers[i].state = State::runnable;
    }
}

// After a round: opens the barriers all their threads reached. 1: run another round,
// 0: every thread returned, -1: a divergent barrier (the message is in launch.error).
static int settle(Launch& launch, Fiber* fibers, unsigned blocks) {
    const unsigned n = launch.block_threads;
    bool opened = false;
    Census grid;
    for (unsigned k = 0; k < blocks; ++k) {
        Fiber* block = fibers + size_t(k) * n;
        Census c;
        for (unsigned t = 0; t < n; ++t) c.add(block[t]);
        for (unsigned t = 0; t < n; ++t) grid.add(block[t]);
        if (c.at(State::at_block_barrier) == n) {
            open_barrier(block, n, State::at_block_barrier);
            opened = true;
        } else if (c.at(State::at_block_barrier)) {
            divergent_block(launch, block[0].block, c);
            return -1;
        }
    }
    unsigned waiting = grid.at(State::at_grid_barrier), returned = grid.at(State::returned);
    if (waiting && returned) {
        const Fiber &w = grid.first_at(State::at_grid_barrier), &r = grid.first_at(State::returned);
        fail(launch, "divergent grid barrier: %u threads wait at this_grid().sync() (first: "
             "block %u thread %u) while %u returned (first: block %u thread %u); every thread "
             "of the grid must reach it", waiting, w.block, w.thread, returned, r.block, r.thread);
        return -1;
    }
    if (opened) return 1;
    if (waiting) {
        open_barrier(fibers, size_t(blocks) * n, State::at_grid_barrier);
        return 1;
    }
    return 0;
}

static bool run_blocks(Launch& launch, Fiber* fibers, unsigned blocks, unsigned char* dynamic) {
    for (;;) {
        if (!run_round(launch, fibers, blocks, dynamic)) return false;
        int next = settle(launch, fibers, blocks);
        if (next <= 0) return next == 0;
    }
}

// Blocks one after another, each on the same stacks with fresh fibers and fresh shared memory.
static bool run_normal(Launch& launch, unsigned grid) {
    const unsigned n = launch.block_threads;
    Stacks stacks(n);
    std::vector<Fiber> fibers(n);
    std::vector<unsigned char> dynamic(launch.shared_stride);
    for (unsigned b = 0; b < grid; ++b) {
        for (unsigned t = 0; t < n; ++t) start(launch, fibers[t], stacks[t], b, t);
        memset(__start_rnnc_shared, POISON, static_bytes());
        memset(dynamic.data(), POISON, dynamic.size());
        if (!run_blocks(launch, fibers.data(), 1, dynamic.data())) return false;
    }
    return true;
}

// Every block's fibers interleaved, with a copy of the static shared section per block.
static bool run_cooperative(Launch& launch, unsigned grid) {
    const size_t n = launch.block_threads, count = size_t(grid) * n;
    Stacks stacks(count);
    std::vector<Fiber> fibers(count);
    std::vector<unsigned char> dynamic(grid * launch.shared_stride, POISON);
    std::vector<unsigned char> statics(grid * static_bytes(), POISON);
    launch.static_copies = statics.data();
    for (size_t i = 0; i < count; ++i) {
        start(launch, fibers[i], stacks[i], unsigned(i / n), unsigned(i % n));
    }
    return run_blocks(launch, fibers.data(), grid, dynamic.data());
}

struct Activation {
    explicit Activation(Launch* launch) { active = launch; }
    ~Activation() { active = nullptr; }
};

// 0: done, 1: the kernel misused a barrier or overflowed a stack, 2: out of memory.
static int run(void (*body)(void**), unsigned grid, unsigned block, unsigned long long shared,
                  int cooperative, void** args, char* error, unsigned long long error_size) {
    std::lock_guard<std::mutex> lock(launch_mutex);
    Launch launch{};
    launch.body = body;
    launch.args = args;
    launch.block_threads = block;
    launch.cooperative = cooperative != 0;
    launch.shared_stride = (shared + SHARED_ALIGN - 1) / SHARED_ALIGN * SHARED_ALIGN;
    launch.error = error;
    launch.error_size = error_size;
    gridDim = {grid, 1, 1};
    blockDim = {block, 1, 1};
    Activation activation(&launch);
    try {
        bool ok = launch.cooperative ? run_cooperative(launch, grid) : run_normal(launch, grid);
        return ok ? 0 : 1;
    } catch (const std::bad_alloc&) {
        snprintf(error, error_size, "out of memory for %u x %u threads' stacks and shared memory",
                 grid, block);
        return 2;
    }
}

}  // namespace rnnc_sync

static inline void __syncthreads() { rnnc_sync::wait(rnnc_sync::State::at_block_barrier); }

// The block's dynamic shared memory: `shared_mem` bytes, 16-byte aligned.
template <typename T>
static inline T* rnnc_shared() {
    return reinterpret_cast<T*>(rnnc_sync::active->dynamic);
}

// The part of CUDA's cooperative groups that block and grid barriers need.
namespace cooperative_groups {
struct thread_block {
    void sync() const { __syncthreads(); }
};
struct grid_group {
    void sync() const { rnnc_sync::wait(rnnc_sync::State::at_grid_barrier); }
};
static inline thread_block this_thread_block() { return {}; }
static inline grid_group this_grid() { return {}; }
}  // namespace cooperative_groups

#endif  // RNNC_SHIM_SYNC_H
