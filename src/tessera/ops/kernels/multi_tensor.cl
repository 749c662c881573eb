// The layout the multi-tensor kernels read (ops.h): the chunk table's columns (ChunkColumn)
// and the step scalars' slots (StepScalar), checked against ops.h by
// ops/kernels/optimizer_updates_host.inc. Placed before optimizer.cl and sum_squares.cl.
#define CHUNK_MAIN 0
#define CHUNK_PARAM 1
#define CHUNK_GRAD 2
#define CHUNK_STATE 3
#define CHUNK_NUMEL 4
#define CHUNK_DECAY 5
#define CHUNK_SLOT 6
#define CHUNK_SEGMENT 7
#define CHUNK_COLUMNS 8

#define SCALAR_LOSS_SCALE 0
#define SCALAR_LR 1
#define SCALAR_WEIGHT_DECAY 2
#define SCALAR_ADAM_DECAY 3
#define SCALAR_ADAM_STEP_SIZE 4
#define SCALAR_ADAM_BC2_SQRT 5
#define SCALAR_SGD_FIRST 6
#define SCALAR_GRAD_SCALE 7
