/* abi_layout_1_8.c — prints the offset and size of every field ABI 1.8 has,
 * one per line: built against the 1.8 headers as released (tests/abi_1_8)
 * and against today's, the two outputs must be equal (ctest
 * abi_1_8_layout_kept): 1.9 only appended, as the ABI promises. Generated
 * from the 1.8 headers' structs. */
#include <ddp/plugin.h>

#include <stdio.h>

#define FIELD(type, field) printf("%s.%s %zu %zu\n", #type, #field, offsetof(type, field), sizeof(((type*)0)->field))

int main(void) {
  FIELD(ddp_key, name);
  FIELD(ddp_key, type);
  FIELD(ddp_key, help);
  FIELD(ddp_buffer, ptr);
  FIELD(ddp_buffer, count);
  FIELD(ddp_buffer, dtype);
  FIELD(ddp_buffer, device);
  FIELD(ddp_param, name);
  FIELD(ddp_param, index);
  FIELD(ddp_param, data);
  FIELD(ddp_param, grad);
  FIELD(ddp_param, numel);
  FIELD(ddp_param, dtype);
  FIELD(ddp_param, trainable);
  FIELD(ddp_param, ndim);
  FIELD(ddp_param, shape);
  FIELD(ddp_param, unit);
  FIELD(ddp_param, uses);
  FIELD(ddp_unit, name);
  FIELD(ddp_unit, index);
  FIELD(ddp_unit, params);
  FIELD(ddp_unit, param_count);
  FIELD(ddp_unit, tied);
  FIELD(ddp_unit, tied_count);
  FIELD(ddp_range, param);
  FIELD(ddp_range, offset);
  FIELD(ddp_range, count);
  FIELD(ddp_range, grad);
  FIELD(ddp_range, data);
  FIELD(ddp_state_buffer, name);
  FIELD(ddp_state_buffer, ptr);
  FIELD(ddp_state_buffer, count);
  FIELD(ddp_host, abi_version);
  FIELD(ddp_host, struct_size);
  FIELD(ddp_host, ctx);
  FIELD(ddp_host, rank);
  FIELD(ddp_host, world_size);
  FIELD(ddp_host, local_rank);
  FIELD(ddp_host, device);
  FIELD(ddp_host, log);
  FIELD(ddp_host, set_error);
  FIELD(ddp_host, config_int);
  FIELD(ddp_host, config_float);
  FIELD(ddp_host, config_bool);
  FIELD(ddp_host, config_string);
  FIELD(ddp_host, param_count);
  FIELD(ddp_host, param);
  FIELD(ddp_host, alloc);
  FIELD(ddp_host, free);
  FIELD(ddp_host, copy);
  FIELD(ddp_host, fill);
  FIELD(ddp_host, scale);
  FIELD(ddp_host, compute_stream);
  FIELD(ddp_host, comm_stream);
  FIELD(ddp_host, launch_host_func);
  FIELD(ddp_host, event_create);
  FIELD(ddp_host, event_destroy);
  FIELD(ddp_host, event_record);
  FIELD(ddp_host, stream_wait_event);
  FIELD(ddp_host, event_synchronize);
  FIELD(ddp_host, event_query);
  FIELD(ddp_host, stream_native);
  FIELD(ddp_host, store_set);
  FIELD(ddp_host, store_get);
  FIELD(ddp_host, store_wait);
  FIELD(ddp_host, timeout_ms);
  FIELD(ddp_host, run_optimizer);
  FIELD(ddp_host, alloc_host);
  FIELD(ddp_host, free_host);
  FIELD(ddp_host, convert);
  FIELD(ddp_host, unit_count);
  FIELD(ddp_host, unit);
  FIELD(ddp_host, claim);
  FIELD(ddp_host, bind);
  FIELD(ddp_host, run_optimizer_ranges);
  FIELD(ddp_host, add);
  FIELD(ddp_plan_collective, op);
  FIELD(ddp_plan_collective, count);
  FIELD(ddp_plan_collective, dtype);
  FIELD(ddp_plan_collective, beside_compute);
  FIELD(ddp_plan, struct_size);
  FIELD(ddp_plan, ctx);
  FIELD(ddp_plan, collectives);
  FIELD(ddp_plan, collective_count);
  FIELD(ddp_plan, micro_steps);
  FIELD(ddp_plan, clips);
  FIELD(ddp_plan, collective);
  FIELD(ddp_plan, buffer);
  FIELD(ddp_plan, steps);
  FIELD(ddp_plan, claims);
  FIELD(ddp_plan, leaner);
  FIELD(ddp_plan, every);
  FIELD(ddp_transport_v1_t, abi_version);
  FIELD(ddp_transport_v1_t, struct_size);
  FIELD(ddp_transport_v1_t, name);
  FIELD(ddp_transport_v1_t, version);
  FIELD(ddp_transport_v1_t, caps);
  FIELD(ddp_transport_v1_t, init);
  FIELD(ddp_transport_v1_t, destroy);
  FIELD(ddp_transport_v1_t, all_reduce);
  FIELD(ddp_transport_v1_t, broadcast);
  FIELD(ddp_transport_v1_t, all_gather);
  FIELD(ddp_transport_v1_t, reduce_scatter);
  FIELD(ddp_transport_v1_t, barrier);
  FIELD(ddp_transport_v1_t, abort);
  FIELD(ddp_transport_v1_t, dtypes);
  FIELD(ddp_transport_v1_t, keys);
  FIELD(ddp_transport_v1_t, plan);
  FIELD(ddp_step_info, struct_size);
  FIELD(ddp_step_info, step);
  FIELD(ddp_step_info, micro_step);
  FIELD(ddp_step_info, micro_steps);
  FIELD(ddp_step_info, sync_grads);
  FIELD(ddp_step_info, params_changed);
  FIELD(ddp_step_info, total_steps);
  FIELD(ddp_strategy_v1_t, abi_version);
  FIELD(ddp_strategy_v1_t, struct_size);
  FIELD(ddp_strategy_v1_t, name);
  FIELD(ddp_strategy_v1_t, version);
  FIELD(ddp_strategy_v1_t, caps);
  FIELD(ddp_strategy_v1_t, create);
  FIELD(ddp_strategy_v1_t, on_train_begin);
  FIELD(ddp_strategy_v1_t, on_step_begin);
  FIELD(ddp_strategy_v1_t, on_grad_ready);
  FIELD(ddp_strategy_v1_t, on_backward_end);
  FIELD(ddp_strategy_v1_t, finish);
  FIELD(ddp_strategy_v1_t, optimizer_step);
  FIELD(ddp_strategy_v1_t, stats);
  FIELD(ddp_strategy_v1_t, destroy);
  FIELD(ddp_strategy_v1_t, held_grads);
  FIELD(ddp_strategy_v1_t, keys);
  FIELD(ddp_strategy_v1_t, on_unit);
  FIELD(ddp_strategy_v1_t, on_train_end);
  FIELD(ddp_strategy_v1_t, grad_ranges);
  FIELD(ddp_strategy_v1_t, plan);
  FIELD(ddp_strategy_v1_t, unit_values);
  FIELD(ddp_strategy_v1_t, take_values);
  FIELD(ddp_strategy_v1_t, on_step_end);
  FIELD(ddp_strategy_v1_t, state);
  printf("values %d %d %d %u %u %u %u %u %u\n", DDP_OK, DDP_ERR_INTERNAL, DDP_FLOAT16, DDP_CAP_DEVICE_CPU,
         DDP_CAP_DEVICE_CUDA, DDP_CAP_OWNS_OPTIMIZER, DDP_CAP_OWNS_GRADIENTS, DDP_CAP_OWNS_PARAMETERS,
         DDP_CAP_DIVERGENT);
  printf("ops %d %d %d %d %d %d %d\n", DDP_OP_ALL_REDUCE, DDP_OP_BARRIER, DDP_STORAGE_GRAD, DDP_STORAGE_DATA,
         DDP_UNIT_BACKWARD_END, DDP_PLAN_STEP, DDP_MEM_CATEGORY_COUNT);
  return 0;
}
