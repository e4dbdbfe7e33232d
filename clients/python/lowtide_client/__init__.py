from lowtide_client._proto.lowtide.v1 import task_pb2
